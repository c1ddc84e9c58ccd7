"""A cached block taken fresh from the free queue keeps its prefix-cache entry: the stale entry later gives hits on
a block now holding another sequence's K/V (vLLM's ``_maybe_evict_cached_block``).
Caught by: test_a_block_taken_fresh_is_evicted ("kept its cache entry")."""
SELECT = "test_a_block_taken_fresh_is_evicted"
MESSAGE = "kept its cache entry"
MUTATE = [("        key = self._key_of.pop(block, None)\n        if key is not None:                          # evicted: its entry goes\n"
           "            del self._cache[key]\n",
           "        key = None                                   # bug: the entry stays\n")]
