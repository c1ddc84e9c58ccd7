"""Bug: RoPE applied to the nope part too: the naive path also rotates q_nope and k_nope
(interleaved, by their own positions). Decoupled RoPE exists so that k_nope carries no
position (and W_UK can be absorbed); only q_rope and the shared k_rope turn.

Caught by: test_naive_matches_float64_oracle ("RoPE was applied to the nope part too").
"""
SELECT = "test_naive_matches_float64_oracle and odd-B2"
MESSAGE = 'RoPE was applied to the nope part too'
MUTATE = [
    ("""            k_nope, v = kv.split([dn, dv], dim=-1)                # (B, Lk, H, dn), (B, Lk, H, dv)
""", """            k_nope, v = kv.split([dn, dv], dim=-1)                # (B, Lk, H, dn), (B, Lk, H, dv)
            cq, sq = _angles(S, L, dn, cfg.rope_theta, wide, x.device)
            ck, sk = _angles(0, Lk, dn, cfg.rope_theta, wide, x.device)
            q_nope = _rope(q_nope, cq[:, None], sq[:, None])
            k_nope = _rope(k_nope, ck[:, None], sk[:, None])
"""),
]
