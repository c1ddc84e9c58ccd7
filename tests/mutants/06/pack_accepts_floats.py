"""Bug: pack_int4 accepts floating codes (casts them) instead of raising TypeError.

Caught by: test_pack_rejects_floating_codes_with_type_error.
"""
SELECT = 'test_pack_rejects_floating_codes_with_type_error and fp32'
MESSAGE = 'codes must have an integer dtype'
MUTATE = [("    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex() \\\n",
           "    if not isinstance(codes, torch.Tensor) or codes.is_complex() \\\n")]
