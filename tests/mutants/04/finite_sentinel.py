"""Triton kernel uses a finite sentinel -1e4 for "minus infinity" (running max
start and masked scores), as many tutorials do with -1e4 or -1e6.

Killed by: graders/04/test_part_b_triton.py::test_part_b_matches_float64_attention
(B2-H1-Lq70-Lk19-D16-causal: fully masked rows get uniform weights, not zeros) and
test_part_b_stable_for_logits_near_minus_1e6 (every logit is below -1e4, so
p = exp(s + 1e4) underflows to 0).
"""
SELECT = 'test_part_b_matches_float64_attention and B2-H1-Lq70-Lk19-D16-causal-fp32'
MESSAGE = 'a finite "minus infinity" such as -1e4'
MUTATE = [
    ('m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)',
     'm_i = tl.full([BLOCK_M], -1.0e4, dtype=tl.float32)'),
    ('s = tl.where(keep, s, float("-inf"))', 's = tl.where(keep, s, -1.0e4)'),
]
