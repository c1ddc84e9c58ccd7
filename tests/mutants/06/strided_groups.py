"""Bug: groups taken as every (in // g)-th column (reshape(out, g, in // g)) instead of
g contiguous columns.

Caught by: test_symmetric_codes_scale_dtypes_shapes_and_range (scale differs per group).
"""
SELECT = 'test_symmetric_codes_scale_dtypes_shapes_and_range and out5-in48-bits4-g16'
MESSAGE = 'groups look strided'
MUTATE = [("    return w.float().reshape(out_f, in_f // g, g), g",
           "    return w.float().reshape(out_f, g, in_f // g).transpose(1, 2), g")]
