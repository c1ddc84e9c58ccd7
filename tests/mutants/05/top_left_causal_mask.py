"""Bug: the causal mask is top-left aligned (j <= i) instead of bottom-right
(j <= i + S): new tokens cannot see the cached prefix beyond their own index.

Killed by (each names the bug): test_multi_token_appends_match_reference,
test_cached_decode_matches_uncached_every_step, test_rope_positions_continue_after_cached_length.
"""
SELECT = 'test_multi_token_appends_match_reference and 5+3+1+4'
MESSAGE = 'causal mask looks top-left aligned'
MUTATE = [
    ("allowed = (j <= i + S)[None, None]", "allowed = (j <= i)[None, None]"),
]
