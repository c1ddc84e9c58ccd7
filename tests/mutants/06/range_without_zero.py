"""Bug: asymmetric range is [min(w), max(w)] instead of [min(w, 0), max(w, 0)]: 0 is not
representable in all-positive groups and constant groups collapse to 0.

Caught by: test_asymmetric_all_positive_groups_keep_zero_in_range.
"""
SELECT = 'test_asymmetric_all_positive_groups_keep_zero_in_range and 4'
MESSAGE = 'the range must include 0'
MUTATE = [("    lo = wg.amin(dim=-1).clamp(max=0) ", "    lo = wg.amin(dim=-1) "),
          ("    hi = wg.amax(dim=-1).clamp(min=0)\n", "    hi = wg.amax(dim=-1)\n")]
