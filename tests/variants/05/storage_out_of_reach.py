"""A real bug of the contract, graded loudly: the caches work (every value, error and cost is
right) but keep their K/V where the graders' storage probe cannot reach: KVCache in a
module-level dict keyed by id(self), PagedKVCache in a closure (a lambda attribute returning
the block tensors; functions are not entered). ``k``/``v`` and ``k_blocks``/``v_blocks`` are
read-only properties. The handout: "keep the preallocated K/V tensors on the cache (directly or
in an object it holds) from __init__ on". Issue "fair, sharp graders", point 2: the storage
checks must not pass vacuously. Since the reachable-tensor walk enters module globals and
closures (issue "Figures from the whole worker", 4), the storage is found, but so is every
other cache's in the same module-level dict: the byte counts (preallocation, the size after
reset, the paged blocks) fail; a check that finds no storage at all still fails with the
NO_STORAGE message. The tests that read no storage (seq_len, filling to max_seq_len, dtype
errors, the model with the cache, generate, the paged block accounting) pass.
"""
BUG = True
MAY_FAIL = ["test_nbytes_equals_formula_and_storage_is_preallocated",
            "test_nbytes_stays_the_storage_size_after_appends_and_reset",
            "test_update_returns_views_of_the_stored_prefix",
            "test_overflow_raises_and_changes_no_byte",
            "test_model_overflow_raises_and_changes_no_byte",
            "test_wrong_shape_or_device_raises_value_error",
            "test_nan_prefilled_cache_gives_finite_identical_results",
            "test_storage_never_reallocated_during_generation",
            "test_paged_nbytes_and_storage_preallocated",
            "test_paged_update_returns_each_sequence_prefix",
            "test_paged_out_of_blocks_raises_and_changes_nothing"]
SELECT = ("nbytes or views or overflow or wrong_shape or wrong_dtype or nan_prefilled or reallocated "
          "or seq_len_advances or fill_exactly or paged")
MUTATE = [
    ("class KVCache:\n",
     "_STORE: dict = {}  # id(cache) -> its K/V: out of the cache's reach\n\n\nclass KVCache:\n"),
    ("        self.k = torch.empty(shape, dtype=dtype, device=device)\n"
     "        self.v = torch.empty(shape, dtype=dtype, device=device)\n",
     "        _STORE[id(self)] = {\"k\": torch.empty(shape, dtype=dtype, device=device),\n"
     "                            \"v\": torch.empty(shape, dtype=dtype, device=device)}\n"),
    ("    def reset(self) -> None:\n"
     "        \"\"\"Empty the cache (``seq_len = 0``); the storage is kept.\"\"\"\n"
     "        self.seq_len = 0\n",
     "    def reset(self) -> None:\n"
     "        \"\"\"Empty the cache (``seq_len = 0``); the storage is kept.\"\"\"\n"
     "        self.seq_len = 0\n"
     "\n"
     "    k = property(lambda self: _STORE[id(self)][\"k\"])\n"
     "    v = property(lambda self: _STORE[id(self)][\"v\"])\n"),
    ("        self.k_blocks = torch.empty(shape, dtype=dtype, device=device)\n"
     "        self.v_blocks = torch.empty(shape, dtype=dtype, device=device)\n",
     "        blocks = (torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))\n"
     "        self._blocks = lambda: blocks  # a closure: the only reference to the block storage\n"),
    ("    @property\n    def num_free_blocks(self) -> int:\n",
     "    k_blocks = property(lambda self: self._blocks()[0])\n"
     "    v_blocks = property(lambda self: self._blocks()[1])\n"
     "\n"
     "    @property\n    def num_free_blocks(self) -> int:\n"),
]
