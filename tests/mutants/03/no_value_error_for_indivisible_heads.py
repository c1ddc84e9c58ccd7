"""Bug: Hq % Hkv != 0 is not checked; the reshape then fails with a RuntimeError
(or, for some shapes, silently mis-groups) instead of the contract's ValueError.

Caught by: test_non_divisible_head_counts_raise_value_error.
"""
SELECT = 'test_non_divisible_head_counts_raise_value_error and 6-4'
MESSAGE = 'Hq % Hkv != 0'
MUTATE = [("    if Hkv < 1 or Hq % Hkv != 0:\n", "    if Hkv < 1:\n")]
