"""``free`` returns a table's blocks to the queue in table order (first block first) instead of reverse order:
the shared prefix blocks, the most likely to be hit again, are evicted first (vLLM: "free blocks in reverse order
so that the tail blocks are evicted first").
Caught by: test_fresh_blocks_come_from_the_head_and_freed_blocks_join_the_tail_last_first ("REVERSE order")."""
SELECT = "test_fresh_blocks_come_from_the_head_and_freed_blocks_join_the_tail_last_first"
MESSAGE = "REVERSE order"
MUTATE = [("        for b in reversed(table):            # the last block first: it is the least likely to be shared\n",
           "        for b in table:                      # bug: first block first\n")]
