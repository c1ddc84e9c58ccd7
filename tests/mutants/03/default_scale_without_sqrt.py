"""Bug: the default scale is 1/D instead of 1/sqrt(D).

Caught by: test_output_matches_float64_oracle (cases with scale=None).
"""
SELECT = 'test_output_matches_float64_oracle and B1-Hq2-Hkv1-Lq3-Lk3-D8-float32-contiguous'
MESSAGE = 'the scores look scaled by 1/D'
MUTATE = [("scale = 1.0 / math.sqrt(D) if scale is None else scale",
           "scale = 1.0 / D if scale is None else scale")]
