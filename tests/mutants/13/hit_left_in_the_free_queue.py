"""``allocate`` counts a hit on a free cached block (count 0 -> 1) but leaves it in the free queue: a later fresh
allocation hands the same block to another sequence, which overwrites K/V still in use (vLLM's
``touch(blocks)``: ``free_block_queue.remove(block)`` when its ref_cnt is 0).
Caught by: test_a_hit_on_a_free_block_leaves_the_free_queue ("a cache hit left in the free queue")."""
SELECT = "test_a_hit_on_a_free_block_leaves_the_free_queue"
MESSAGE = "a cache hit left in the free queue"
MUTATE = [("            if self._ref[b] == 0:\n                del self._free[b]\n            self._ref[b] += 1\n",
           "            self._ref[b] += 1                     # bug: a free hit stays in the queue\n")]
