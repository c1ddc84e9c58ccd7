"""Triton kernel returns lse in base 2 (m * log2(e) + log2(l)), the Triton
tutorial's internal form, instead of the natural log.

Killed by: graders/04/test_part_b_triton.py::test_part_b_matches_float64_attention
("lse looks like base 2").
"""
SELECT = 'test_part_b_matches_float64_attention and B1-H1-Lq1-Lk1-D16-full-fp32'
MESSAGE = 'lse looks like base 2'
MUTATE = [
    ('lse = tl.where(empty, float("-inf"), m_i + tl.log(l_safe))',
     'lse = tl.where(empty, float("-inf"), m_i * LOG2E + tl.log2(l_safe))'),
]
