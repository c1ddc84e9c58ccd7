"""Triton kernel's causal loop bound stops one query block early
(pid_m * BLOCK_M instead of (pid_m + 1) * BLOCK_M), skipping keys on the diagonal.

Killed by: graders/04/test_part_b_triton.py::test_part_b_matches_float64_attention
(square causal B1-H2-Lq37-Lk37-D64).
"""
SELECT = 'test_part_b_matches_float64_attention and B1-H2-Lq37-Lk37-D64-causal-fp32'
MESSAGE = 'a causal loop bound skips the diagonal key block'
MUTATE = [
    ("hi = tl.minimum(Lk, (pid_m + 1) * BLOCK_M + Lk - Lq)", "hi = tl.minimum(Lk, pid_m * BLOCK_M + Lk - Lq)"),
]
