"""The target's cache is emptied after every block and the whole sequence recomputed: right tokens at the
cost of quadratic target work (the KV cache is not reused).
Caught by: test_call_and_position_counts_stay_in_the_contracts_bounds ("a token recomputed")."""
SELECT = 'test_call_and_position_counts_stay_in_the_contracts_bounds'
MESSAGE = 'a token recomputed'
MUTATE = [('        t_cache.crop(min(t_cache.seq_len, N + n))   # the emitted sequence minus its last token\n', '        t_cache.crop(0)                             # bug: recompute the prefix every block\n')]
