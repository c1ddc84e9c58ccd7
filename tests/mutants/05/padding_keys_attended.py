"""Bug: attention_mask only shifts the RoPE positions; padded keys are not masked
out, so left-padded rows attend to the pad tokens.

Killed by: test_left_padded_batch_equals_each_prompt_alone (cache and no-cache),
test_left_padded_cached_forward_matches_each_row_alone (names it: padded keys were attended).
"""
SELECT = 'test_left_padded_cached_forward_matches_each_row_alone'
MESSAGE = 'padded keys were attended'
MUTATE = [
    ("            allowed = allowed & attention_mask.bool()[:, None, None, :]  # (B, 1, T, S+T): padded keys off\n",
     "            allowed = allowed.expand(B, 1, T, S + T)\n"),
]
