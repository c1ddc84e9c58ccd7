"""Backward drops the D_i = rowsum(dO * O) term: dS = P * dP instead of
P * (dP - D_i). dV is still right; dQ and dK are wrong.

Killed by: graders/04/test_part_c_backward.py::test_part_c_gradients_match_float64_autograd.
"""
SELECT = 'test_part_c_gradients_match_float64_autograd and B1-H1-Lq1-Lk1-D16-full-fp32-contiguous'
MESSAGE = 'dS lacks the Delta term'
MUTATE = [
    ("ds = p * (dp - delta[:, :, i0:i1, None])", "ds = p * dp"),
]
