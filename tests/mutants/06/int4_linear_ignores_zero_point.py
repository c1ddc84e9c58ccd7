"""Bug: QuantizedLinear(bits=4) dequantizes without its zero point.

Caught by: test_from_linear_forward_equals_x_times_dequantized_weight.
"""
SELECT = 'test_from_linear_forward_equals_x_times_dequantized_weight and bits4-default-normal-bias'
MESSAGE = 'zero point never subtracted'
MUTATE = [("        return dequantize(codes, self.scale, self.zero_point, group_size=self.group_size)",
           "        return dequantize(codes, self.scale, None, group_size=self.group_size)")]
