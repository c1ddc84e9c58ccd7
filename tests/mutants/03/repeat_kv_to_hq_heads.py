"""Bug: repeats K and V to Hq heads (repeat_interleave) before a plain MHA matmul.

Numerically right, but allocates B*Hq*Lk*D elements: the memory rule forbids it.
Caught by: test_no_tensor_larger_than_scores_q_or_kv.
"""
SELECT = 'test_no_tensor_larger_than_scores_q_or_kv and B1-Hq32-Hkv2-Lq1-Lk16384-D64'
MESSAGE = 'K/V materialised at Hq heads'
MUTATE = [
    ("    qf = q.to(acc).reshape(B, Hkv, G * Lq, D)                     # (B, Hkv, G*Lq, D)\n"
     "    kf, vf = k.to(acc), v.to(acc)                                 # (B, Hkv, Lk, D), no repeat\n",
     "    qf = q.to(acc).reshape(B, Hkv, G * Lq, D)\n"
     "    kf = k.to(acc).repeat_interleave(G, dim=1)                    # (B, Hq, Lk, D): the bug\n"
     "    vf = v.to(acc).repeat_interleave(G, dim=1)\n"
     "    qf = qf.view(B, Hq, Lq, D)\n"),
    ("    s = s.view(B, Hkv, G, Lq, Lk)\n", "    s = s.reshape(B, Hkv, G, Lq, Lk)\n"),
    ("    out = p.view(B, Hkv, G * Lq, Lk) @ vf ", "    out = p.reshape(B, Hq, Lq, Lk) @ vf "),
]
