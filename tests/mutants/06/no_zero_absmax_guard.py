"""Bug: symmetric quantization divides by the raw scale; an all-zero group gives 0/0 = NaN,
which the int8 cast happens to turn into 0 on this machine (undefined behaviour).

Caught by: test_zero_and_constant_groups_never_make_nan_or_inf.
"""
SELECT = 'test_zero_and_constant_groups_never_make_nan_or_inf and bits8-row-symmetric'
MESSAGE = 'NaN/Inf produced while quantizing all-zero/constant groups'
MUTATE = [("    safe = torch.where(scale == 0, torch.ones_like(scale), scale)   # zero-absmax guard\n",
           "    safe = scale\n")]
