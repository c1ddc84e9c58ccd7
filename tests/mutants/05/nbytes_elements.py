"""Bug: KVCache.nbytes counts elements, not bytes (element_size forgotten).

Killed by: test_nbytes_equals_formula_and_storage_is_preallocated,
test_nbytes_stays_the_storage_size_after_appends_and_reset.
"""
SELECT = 'test_nbytes_equals_formula_and_storage_is_preallocated and L1-B1-S7-H1-D2-fp32'
MESSAGE = 'nbytes is wrong'
MUTATE = [
    ("        self.nbytes = 2 * self.k.numel() * self.k.element_size()\n        self.seq_len = 0\n",
     "        self.nbytes = 2 * self.k.numel()\n        self.seq_len = 0\n"),
]
