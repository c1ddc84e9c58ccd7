"""Triton kernel masks key columns with the first block's offsets (offs_n < Lk)
instead of this block's (start_n + offs_n < Lk): the padded keys of a ragged
last block get score 0 instead of -inf and inflate the softmax sum.

Killed by: graders/04/test_part_b_triton.py::test_part_b_matches_float64_attention
(B1-H2-Lq50-Lk67-D32-full: the last key block holds 3 real keys).
"""
SELECT = 'test_part_b_matches_float64_attention and B1-H2-Lq50-Lk67-D32-full-fp32'
MESSAGE = 'padded keys of a ragged last key block were not masked'
MUTATE = [
    ("keep = col_ok[None, :]", "keep = (offs_n < Lk)[None, :]"),
]
