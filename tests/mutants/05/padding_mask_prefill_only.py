"""Bug: the padding mask is applied only when T > 1 (the prefill and multi-token appends):
single-token decode steps attend to the pad keys of left-padded rows. A common shortcut
("decode needs no mask: it may see every cached key"), true only without padding. Nothing
crashes and no NaN appears: the decode steps' logits of a padded row drift, and its greedy
tokens may or may not change.

Killed by: test_left_padded_cached_forward_matches_each_row_alone (the silent case: logits of
the decode steps, atol 1e-5; names it "padded keys were attended"),
test_left_padded_decode_steps_mask_pad_keys (single-token steps only, compared with the model's
uncached forward) and test_left_padded_batch_equals_each_prompt_alone[cache] (greedy tokens, when
the drift changes one).
"""
SELECT = 'test_left_padded_cached_forward_matches_each_row_alone'
MESSAGE = 'padded keys were attended'
MUTATE = [
    ("        if attention_mask is not None:\n            allowed = allowed & attention_mask.bool()[:, None, None, :]",
     "        if attention_mask is not None and T > 1:  # a decode step may see every cached key\n"
     "            allowed = allowed & attention_mask.bool()[:, None, None, :]"),
]
