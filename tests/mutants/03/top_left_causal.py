"""Bug: causal mask aligned top-left (query i sees keys 0..i) instead of bottom-right
(keys 0..i + Lk - Lq); identical only when Lq == Lk.

Caught by: test_causal_mask_is_bottom_right_aligned.
"""
SELECT = 'test_causal_mask_is_bottom_right_aligned and 3-8'
MESSAGE = 'causal mask looks top-left aligned'
MUTATE = [("s = s.masked_fill(j > i + (Lk - Lq), float(\"-inf\"))", "s = s.masked_fill(j > i, float(\"-inf\"))")]
