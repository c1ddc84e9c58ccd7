"""Backward recomputes P = exp(S - lse) without guarding lse = -inf of fully
masked rows: exp(-inf - (-inf)) = NaN poisons dQ, dK and dV.

Killed by: graders/04/test_part_c_backward.py::test_part_c_gradients_match_float64_autograd
(B1-H2-Lq70-Lk19-D16-causal) and test_part_c_fully_masked_rows_have_zero_gradients.
"""
SELECT = 'test_part_c_gradients_match_float64_autograd and B1-H2-Lq70-Lk19-D16-causal-fp32-contiguous'
MESSAGE = 'has NaN/inf with fully masked rows'
MUTATE = [
    ("lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)", "lse_safe = lse"),
]
