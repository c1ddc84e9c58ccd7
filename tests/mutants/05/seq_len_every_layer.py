"""Bug: KVCache.update advances seq_len on every layer's update instead of only
after layer n_layers-1, so later layers write past the earlier ones' slots and read
a wrong position offset.

Killed by: test_seq_len_advances_only_after_last_layer, and named as well by every test that
appends through several layers (the stored-prefix checks) or drives the model with a cache
(test_cached_decode_matches_uncached_every_step, test_multi_token_appends_match_reference).
"""
SELECT = 'test_seq_len_advances_only_after_last_layer'
MESSAGE = 'seq_len advanced at the wrong time'
MUTATE = [
    ("        if layer_idx == self.n_layers - 1:\n            self.seq_len = S + T\n",
     "        self.seq_len = S + T\n"),
]
