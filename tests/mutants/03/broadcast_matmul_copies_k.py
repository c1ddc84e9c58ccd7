"""Bug: scores computed as q.view(B, Hkv, G, Lq, D) @ k.unsqueeze(2).transpose(-1, -2):
right values, but matmul expands *and copies* K to (B, Hkv, G, D, Lk) = Hq heads (and V
likewise), breaking the no-repeat memory rule.

Caught by: test_no_tensor_larger_than_scores_q_or_kv.
"""
SELECT = 'test_no_tensor_larger_than_scores_q_or_kv and B1-Hq32-Hkv2-Lq1-Lk16384-D64'
MESSAGE = 'K/V materialised at Hq heads'
MUTATE = [
    ("    s = (qf @ kf.transpose(-1, -2)) * scale                       # (B, Hkv, G*Lq, Lk)\n"
     "    s = s.view(B, Hkv, G, Lq, Lk)\n",
     "    s = (qf.view(B, Hkv, G, Lq, D) @ kf.unsqueeze(2).transpose(-1, -2)) * scale\n"),
    ("    out = p.view(B, Hkv, G * Lq, Lk) @ vf                         # (B, Hkv, G*Lq, D)\n",
     "    out = p @ vf.unsqueeze(2)\n"),
]
