"""Bug (Part B): allocate() on a live seq_id silently starts it over, leaking the
blocks its old table held, instead of raising ValueError.

Killed by: test_paged_bad_arguments_raise.
"""
SELECT = 'test_paged_bad_arguments_raise'
MESSAGE = 'allocate(1) while seq 1 is live'
MUTATE = [
    ("        if seq_id in self._tables:\n            raise ValueError(f\"seq_id {seq_id!r} is already allocated\")\n", ""),
]
