"""Bug (Part B): PagedKVCache.free forgets the sequence but never returns its blocks
to the pool, so freed memory is lost.

Killed by: test_paged_free_returns_blocks_for_reuse.
"""
SELECT = 'test_paged_free_returns_blocks_for_reuse'
MESSAGE = 'free() returned 0 blocks to the pool'
MUTATE = [
    ("        self._free.extend(reversed(table))\n", ""),
]
