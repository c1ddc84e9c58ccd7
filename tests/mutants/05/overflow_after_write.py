"""Bug: on overflow, update writes the positions that still fit and only then raises,
so a refused append changes the storage.

Killed by: test_overflow_raises_and_changes_no_byte,
test_model_overflow_raises_and_changes_no_byte.
"""
SELECT = 'test_overflow_raises_and_changes_no_byte and layer0'
MESSAGE = 'overflow wrote to the storage before raising'
MUTATE = [
    ("        if S + T > self.max_seq_len:  # check before writing: an overflow changes nothing\n"
     "            raise ValueError(f\"KVCache overflow: {S} positions stored + {T} new > max_seq_len={self.max_seq_len}\")\n"
     "        self.k[layer_idx, :, :, S:S + T] = k\n"
     "        self.v[layer_idx, :, :, S:S + T] = v\n",
     "        fit = min(T, self.max_seq_len - S)\n"
     "        self.k[layer_idx, :, :, S:S + fit] = k[:, :, :fit]\n"
     "        self.v[layer_idx, :, :, S:S + fit] = v[:, :, :fit]\n"
     "        if fit < T:\n"
     "            raise ValueError(f\"KVCache overflow: {S} positions stored + {T} new > max_seq_len={self.max_seq_len}\")\n"),
]
