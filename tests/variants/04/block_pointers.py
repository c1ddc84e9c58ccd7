"""A real bug graded in one place: the kernel loads q and walks v with block pointers
(tl.make_block_ptr, tl.advance). The pinned Triton 3.7 still runs them (its values are
right), Triton 3.9 removed them; only the no-block-pointer rule fails, with its message,
before anything runs (issue 13, point 3).
"""
MUTATE = [
    ("    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)    # (BLOCK_M, HEAD_DIM)\n",
     "    q_blk = tl.make_block_ptr(Q + b * stride_qb + h * stride_qh, shape=(Lq, HEAD_DIM),\n"
     "                              strides=(stride_qm, stride_qd), offsets=(pid_m * BLOCK_M, 0),\n"
     "                              block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))\n"
     "    q = tl.load(q_blk, boundary_check=(0,), padding_option=\"zero\")\n"),
    ("    for start_n in range(0, hi, BLOCK_N):\n",
     "    v_blk = tl.make_block_ptr(V + b * stride_vb + h * stride_vh, shape=(Lk, HEAD_DIM),\n"
     "                              strides=(stride_vn, stride_vd), offsets=(0, 0),\n"
     "                              block_shape=(BLOCK_N, HEAD_DIM), order=(1, 0))\n"
     "    for start_n in range(0, hi, BLOCK_N):\n"),
    ("        v = tl.load(v_ptrs + start_n * stride_vn, mask=col_ok[:, None], other=0.0)\n",
     "        v = tl.load(v_blk, boundary_check=(0,), padding_option=\"zero\")\n"
     "        v_blk = tl.advance(v_blk, (BLOCK_N, 0))\n"),
]
BUG = True
MAY_FAIL = ["test_part_b_uses_no_block_pointers"]
SELECT = "test_part_b and not deterministic"
