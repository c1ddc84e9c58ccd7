"""``append_slot`` takes the next block when the current one becomes full (``(p + 1) % B == 0``) and writes
position p at ``table[-1]``: the slot of a full block's last position lands in the next block, and every sequence
holds a block too many at those positions (the off-by-one the contract's ``p % B == 0`` rule avoids).
Caught by: test_append_slot_reserves_the_next_position ("the slot of a full block's last position")."""
SELECT = "test_append_slot_reserves_the_next_position"
MESSAGE = "the slot of a full block's last position"
MUTATE = [("        if p % B == 0:\n            if not self._free:\n",
           "        if (p + 1) % B == 0 or not table:\n            if not self._free:\n"),
          ("        self._slots[seq_id] = p + 1\n        return table[p // B] * B + p % B\n",
           "        self._slots[seq_id] = p + 1\n        return table[-1] * B + p % B\n"),
          ("        return self._slots[seq_id] % self.block_size != 0 or self.num_free_blocks > 0\n",
           "        return (self._slots[seq_id] + 1) % self.block_size != 0 or self.num_free_blocks > 0\n")]
