"""Fresh blocks are taken from the tail of the free queue (LIFO, a plain ``list.pop()``) instead of its head: the
most recently freed blocks, those most likely to be hit again, are evicted first (vLLM's FreeKVCacheBlockQueue is
LRU: ``popleft``).
Caught by: test_fresh_blocks_come_from_the_head_and_freed_blocks_join_the_tail_last_first ("from the head")."""
SELECT = "test_fresh_blocks_come_from_the_head_and_freed_blocks_join_the_tail_last_first"
MESSAGE = "from the head"
MUTATE = [("        block, _ = self._free.popitem(last=False)   # the head\n",
           "        block, _ = self._free.popitem(last=True)    # bug: the tail\n")]
