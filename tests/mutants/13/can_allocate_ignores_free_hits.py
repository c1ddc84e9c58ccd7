"""``can_allocate`` subtracts every hit from the blocks needed, also a hit on a block in the free queue, which
the allocation takes out of the queue: it answers True with too few free blocks, and ``allocate`` then fails in
the middle (vLLM counts only the hits with ref_cnt 0 as using free blocks: ``num_evictable_computed_blocks``).
Caught by: test_can_allocate_counts_a_hit_on_a_free_block_as_a_free_block ("as a free block it uses")."""
SELECT = "test_can_allocate_counts_a_hit_on_a_free_block_as_a_free_block"
MESSAGE = "as a free block it uses"
MUTATE = [("        in_use = sum(1 for b in hits if self._ref[b] > 0)\n",
           "        in_use = len(hits)                   # bug: free hits counted as not needing a free block\n")]
