"""Bug: pack_int4 does not check that codes are in [0, 15]; 16 silently becomes 0 in a nibble.

Caught by: test_pack_out_of_range_code_raises_value_error.
"""
SELECT = 'test_pack_out_of_range_code_raises_value_error and 16-uint8'
MESSAGE = 'codes are in [0, 15]'
MUTATE = [("    if codes.numel() and (codes.min() < 0 or codes.max() > 15):\n",
           "    if False:\n")]
