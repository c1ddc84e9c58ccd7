"""Triton kernel masks causally top-left aligned (query i sees keys 0..i), SDPA's
is_causal convention, instead of bottom-right (j <= i + Lk - Lq).

Killed by: graders/04/test_part_b_triton.py::test_part_b_matches_float64_attention
(Lq != Lk causal cases; the message says "causal mask looks top-left aligned").
"""
SELECT = 'test_part_b_matches_float64_attention and B1-H1-Lq19-Lk70-D128-causal-fp32'
MESSAGE = 'causal mask looks top-left aligned'
MUTATE = [
    ("keep = keep & (cols[None, :] <= offs_m[:, None] + (Lk - Lq))",
     "keep = keep & (cols[None, :] <= offs_m[:, None])"),
]
