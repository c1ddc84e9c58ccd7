"""checkpoint_sequential does not check 1 <= segments <= len(blocks): 0 divides by zero, -1 fails on an empty
split, len(blocks) + 1 runs with an empty segment instead of raising ValueError.
Caught by: test_sequential_bad_segments_raise ("segments outside [1, len(blocks)]": expected ValueError)."""
SELECT = 'test_sequential_bad_segments_raise'
MESSAGE = 'segments outside [1, len(blocks)]'
MUTATE = [("    if not 1 <= segments <= n:\n        raise ValueError(f\"segments must be in [1, len(blocks)] = [1, {n}], "
           "got {segments}\")\n", "")]
