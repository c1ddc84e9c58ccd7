"""Bug: quantize_asymmetric forgets to add the zero point to the codes (codes = clamp(round(w /
scale), 0, 2**bits - 1)) while still returning it, so every negative weight clips to code 0 and
dequantize's (codes - zero_point) * scale shifts the rest down by zero_point * scale.

Caught by: test_asymmetric_codes_zero_point_dtypes_and_ranges (named "zero point never added").
"""
SELECT = 'test_asymmetric_codes_zero_point_dtypes_and_ranges and out3-in20-bits8-row'
MESSAGE = 'zero point never added'
MUTATE = [("    codes = (torch.round(wg / safe[..., None]) + zero_point[..., None]).clamp(0, qmax)",
           "    codes = torch.round(wg / safe[..., None]).clamp(0, qmax)")]
