"""Bug: symmetric scale = absmax / 2**(bits-1) (128 for int8) instead of
absmax / (2**(bits-1) - 1); the largest weight clips to qmax.

Caught by: test_symmetric_codes_scale_dtypes_shapes_and_range.
"""
SELECT = 'test_symmetric_codes_scale_dtypes_shapes_and_range and out3-in20-bits8-row'
MESSAGE = 'scale is absmax / 2**(bits-1)'
MUTATE = [("    scale = wg.abs().amax(dim=-1) / qmax ", "    scale = wg.abs().amax(dim=-1) / 2 ** (bits - 1) ")]
