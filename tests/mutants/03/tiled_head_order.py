"""Bug: query head h uses KV head h % Hkv (tiling, [kv0, kv1, kv0, kv1]) instead of
h // (Hq // Hkv) (the repeat_interleave order, [kv0, kv0, kv1, kv1]).

Caught by: test_query_head_uses_kv_head_h_div_group (and the oracle tests when Hkv > 1).
"""
SELECT = 'test_query_head_uses_kv_head_h_div_group and 4-2'
MESSAGE = 'KV heads look tiled ([kv0, kv1, kv0, kv1], h % Hkv)'
MUTATE = [
    ("    qf = q.to(acc).reshape(B, Hkv, G * Lq, D)  ",
     "    qf = q.to(acc).view(B, G, Hkv, Lq, D).transpose(1, 2).reshape(B, Hkv, G * Lq, D)  "),
    ("    return out.view(B, Hq, Lq, D).to(q.dtype)",
     "    return out.view(B, Hkv, G, Lq, D).transpose(1, 2).reshape(B, Hq, Lq, D).to(q.dtype)"),
]
