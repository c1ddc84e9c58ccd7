"""``cache_full_blocks`` also registers the last, partial block (``ceil(len / B)`` blocks instead of
``len // B``): its key covers fewer than B tokens, and since each block is offered once, the block is never
registered again when it fills up (vLLM caches only ``num_full_blocks = num_computed_tokens // block_size``).
Caught by: test_only_full_blocks_are_cached ("a partial block was cached")."""
SELECT = "test_only_full_blocks_are_cached"
MESSAGE = "a partial block was cached"
MUTATE = [("        full = len(token_ids) // self.block_size\n        done = self._offered[seq_id]\n",
           "        full = -(-len(token_ids) // self.block_size)   # bug: the partial block too\n"
           "        done = self._offered[seq_id]\n"),
          ("            key = hash((key, tuple(token_ids[i * B:(i + 1) * B])))\n",
           "            key = hash((key, tuple(token_ids[i * B:(i + 1) * B]), min(B, len(token_ids) - i * B)))\n")]
