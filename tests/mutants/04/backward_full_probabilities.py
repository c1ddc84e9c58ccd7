"""Backward recomputes the whole (B, H, Lq, Lk) probability matrix at once
(one block of Lq x Lk): right gradients, but the memory bound is broken.

Killed by: graders/04/test_part_c_backward.py::test_part_c_backward_allocates_no_score_matrix.
"""
SELECT = 'test_part_c_backward_allocates_no_score_matrix and full'
MESSAGE = 'the backward materialised an (Lq, Lk) matrix'
MUTATE = [
    ("dq, dk, dv = _flash_backward(q, k, v, out, dout, lse, ctx.is_causal, ctx.scale)",
     "dq, dk, dv = _flash_backward(q, k, v, out, dout, lse, ctx.is_causal, ctx.scale,\n"
     "                                     block_q=q.shape[2], block_k=k.shape[2])"),
]
