"""A real bug graded in one place: update returns the whole per-layer buffer (max_seq_len
slots) and attention masks the slots past seq_len + T instead of never reading them
(tests/mutants/05/whole_buffer_returned.py). The stored prefix is right, so the cache's
other properties (nbytes and preallocation, seq_len, filling to max_seq_len, the overflow
rule, bad arguments) must not be lost to it: before issue 13 point 7 the stored-prefix
check of every such test failed on the extra slots. Model tests are not selected: their
logits depend on what torch.empty left in the unwritten slots.
"""
BUG = True
MESSAGE = 'slots past seq_len were read'  # the bug class, named in every failing test
MAY_FAIL = ["test_update_returns_views_of_the_stored_prefix", "test_nan_prefilled_cache_gives_finite_identical_results"]
SELECT = ("nbytes_equals or seq_len_advances or fill_exactly or test_overflow_raises or wrong_shape or wrong_dtype "
          "or update_returns_views or nan_prefilled")
MUTATE = [
    ("        return self.k[layer_idx, :, :, :S + T], self.v[layer_idx, :, :, :S + T]\n",
     "        return self.k[layer_idx], self.v[layer_idx]\n"),
    ("        j = torch.arange(S + T, device=x.device)[None, :]\n",
     "        j = torch.arange(k.shape[2], device=x.device)[None, :]\n"),
]
