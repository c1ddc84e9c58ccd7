"""collective_seq_id counts every recorded call on the rank, not per process group (torch counts per group:
seqCollective_). Caught by: test_recorder_entries_of_a_completed_program."""
SELECT = 'test_recorder_entries_of_a_completed_program'
MESSAGE = 'wrong flight-recorder entry'
MUTATE = [
    ('            self._seq[pg] += 1\n',
     '            self._seq[pg] = len(self.entries) + 1\n'),
]
