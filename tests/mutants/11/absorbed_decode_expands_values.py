"""Bug: the absorbed path folds W_UK into the query but still decompresses the values,
v = c_kv W_UV^T per head over the whole cache, (B, H, Lk, v), before attending: the
values are right, the memory is the naive path's.

Caught by: test_absorbed_decode_allocates_no_per_head_key_or_value ("the absorbed decode
step materialised a per-head key or value over the cache").
"""
SELECT = "test_absorbed_decode_allocates_no_per_head_key_or_value"
MESSAGE = 'the absorbed decode step materialised a per-head key or value over the cache'
MUTATE = [
    ("""            o_lat = p.view(B, H * L, Lk) @ c                      # (B, H*L, r): the attended latent
            o = torch.einsum("bhlr,hvr->blhv", o_lat.view(B, H, L, r), w_uv)  # W_UV after attention""",
     """            v = torch.einsum("bkr,hvr->bhkv", c, w_uv)            # per-head values over the cache
            o = (p @ v).transpose(1, 2)                           # (B, L, H, dv)"""),
]
