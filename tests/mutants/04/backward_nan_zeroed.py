"""Backward recomputes P = exp(S - lse) without guarding lse = -inf of fully masked rows, then
"fixes" the NaN gradients it gets by zeroing them (``nan_to_num``), a common patch. Nothing
is NaN any more, and dq of the fully masked rows is even zero, but the NaN of those rows
had spread to every dk and dv element their tile touched: zeroing them drops the other rows'
contributions too. The silent case of the unguarded lse = -inf (backward_nan_masked_rows.py is
the loud one).

Killed by: graders/04/test_part_c_backward.py::test_part_c_fully_masked_rows_have_zero_gradients
and test_part_c_gradients_match_float64_autograd (B1-H2-Lq70-Lk19-D16-causal), each naming it:
the same call without the fully masked rows is right.
"""
SELECT = 'test_part_c_fully_masked_rows_have_zero_gradients and cpu'
MESSAGE = "fully masked rows change the other rows' gradients"
MUTATE = [
    ("lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)", "lse_safe = lse"),
    ("    return dq, dk, dv\n",
     "    return dq.nan_to_num(0.0), dk.nan_to_num(0.0), dv.nan_to_num(0.0)  # NaN: no gradient\n"),
]
