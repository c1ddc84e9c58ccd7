"""Bug: RoPE positions restart at 0 for every call instead of continuing from
cache.seq_len, so each decode step's token is rotated as if it were first.

Killed by (each names the bug): test_rope_positions_continue_after_cached_length,
test_cached_decode_matches_uncached_every_step, test_multi_token_appends_match_reference.
"""
SELECT = 'test_rope_positions_continue_after_cached_length and S1 and not S13'
MESSAGE = 'RoPE positions restart at 0'
MUTATE = [
    ("positions = torch.arange(S, S + T, device=x.device).expand(B, T)",
     "positions = torch.arange(T, device=x.device).expand(B, T)"),
]
