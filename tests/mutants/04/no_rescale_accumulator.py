"""Triton kernel forgets to rescale the output accumulator by exp(m_old - m_new)
when the running max grows (the sum l is still rescaled).

Killed by: graders/04/test_part_b_triton.py::test_part_b_matches_float64_attention
(any case with several key blocks, e.g. B1-H2-Lq50-Lk67-D32-full-fp32).
"""
SELECT = 'test_part_b_matches_float64_attention and B1-H2-Lq50-Lk67-D32-full-fp32'
MESSAGE = 'the accumulator is not rescaled'
MUTATE = [
    ("acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)",
     "acc = acc + tl.dot(p.to(v.dtype), v)"),
]
