"""Bug: KVCache.nbytes counts elements, not bytes (element_size forgotten).

Killed by: test_nbytes_equals_formula_and_storage_is_preallocated.
"""
MUTATE = [
    ("        self.nbytes = 2 * self.k.numel() * self.k.element_size()\n        self.seq_len = 0\n",
     "        self.nbytes = 2 * self.k.numel()\n        self.seq_len = 0\n"),
]
