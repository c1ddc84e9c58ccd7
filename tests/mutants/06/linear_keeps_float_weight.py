"""Bug: from_linear keeps a reference to the original nn.Linear (and its float weight),
so the module stores 4 bytes per weight on top of the codes.

Caught by: test_weight_storage_is_out_in_bits_over_8_plus_scales.
"""
SELECT = 'test_weight_storage_is_out_in_bits_over_8_plus_scales and bits8-row'
MESSAGE = 'do not keep the float weight'
MUTATE = [("        q.scale.copy_(scale)\n", "        q.scale.copy_(scale)\n        q.source = linear\n")]
