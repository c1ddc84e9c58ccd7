"""Bug: dequantize subtracts the zero point in the integer dtype (uint8 - uint8 wraps
around below 0) before converting to float.

Caught by: test_dequantize_matches_formula.
"""
SELECT = 'test_dequantize_matches_formula and row'
MESSAGE = 'uint8 - uint8 wraps around'
MUTATE = [("    c = codes.to(torch.float32).reshape(out_f, n, g)\n", "    c = codes.reshape(out_f, n, g)\n"),
          ("        c = c - zero_point.to(torch.float32)[..., None]\n", "        c = c - zero_point[..., None]\n"),
          ("    return (c * scale.to(torch.float32)[..., None]).reshape(out_f, in_f)",
           "    return (c.to(torch.float32) * scale.to(torch.float32)[..., None]).reshape(out_f, in_f)")]
