"""Bug: cache overflow not refused: no seq_len + L <= max_seq_len check, so an append past
the end fails inside the write with whatever error the slice assignment gives (or, into a
larger buffer, silently), never the contract's ValueError naming max_seq_len.

Caught by: test_overflow_raises_naming_max_seq_len_and_changes_nothing ("cache overflow
not refused").
"""
SELECT = "test_overflow_raises_naming_max_seq_len_and_changes_nothing"
MESSAGE = 'cache overflow not refused'
MUTATE = [
    ("        if self.seq_len + L > self.max_seq_len:\n"
     "            raise ValueError(f\"cache overflow: {L} new tokens after {self.seq_len} stored exceed \"\n"
     "                             f\"max_seq_len={self.max_seq_len}\")\n", ""),
]
