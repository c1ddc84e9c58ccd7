"""Bug: RoPE positions not offset by seq_len in the cache: every call rotates its L new
tokens from position 0, so a decode step's query and key are turned as if first.

Caught by: test_rope_positions_continue_after_the_cached_length ("RoPE positions restart
at 0 for each call").
"""
SELECT = "test_rope_positions_continue_after_the_cached_length and S11"
MESSAGE = 'RoPE positions restart at 0 for each call'
MUTATE = [("        cos, sin = _angles(S, L, dr, cfg.rope_theta, wide, x.device)\n",
           "        cos, sin = _angles(0, L, dr, cfg.rope_theta, wide, x.device)\n")]
