"""When two blocks hold the same prefix, the last one offered replaces the entry (nano-vllm's
``hash_to_block_id[h] = block_id``); the contract keeps the first (block ids are part of the contract), and the
replaced block stays marked cached.
Caught by: test_the_first_block_offered_for_a_prefix_keeps_the_entry ("the first block offered")."""
SELECT = "test_the_first_block_offered_for_a_prefix_keeps_the_entry"
MESSAGE = "the first block offered"
MUTATE = [("            if key not in self._cache:       # first offered wins; a duplicate stays uncached\n",
           "            if True:                         # bug: the last offered wins\n")]
