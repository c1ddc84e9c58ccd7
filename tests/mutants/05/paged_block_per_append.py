"""Bug (Part B): each append takes ceil(T / block_size) new blocks, ignoring the free
slots left in the sequence's last block, so a sequence wastes up to a block per append
(and every layer takes its own).

Killed by: test_paged_wasted_slots_below_block_size, and named as well where the waste runs the
pool dry (test_paged_free_returns_blocks_for_reuse, test_paged_out_of_blocks_raises_and_changes_nothing).
"""
SELECT = 'test_paged_wasted_slots_below_block_size'
MESSAGE = 'wasted slots >= block_size'
MUTATE = [
    ("need = -(-(S + T) // self.block_size) - len(table)", "need = -(-T // self.block_size)"),
]
