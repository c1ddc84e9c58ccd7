"""Bug: pack_int4 puts element 2i in the HIGH nibble ([1, 2] -> 0x12) and unpack_int4 reads it
back from there: the round trip works (QuantizedLinear is right) but the format is not the
contract's.

Issue point 7: graded in one place, the two format tests (pack's and unpack's, each checked
against the contract's bytes, not against the other function). The every-integer-dtype test
packs pairs of equal codes, where the nibble order cannot matter, so it passes."""
MUTATE = [("    return c[..., 0::2] | (c[..., 1::2] << 4)", "    return (c[..., 0::2] << 4) | c[..., 1::2]"),
          ("    low, high = packed & 0xF, packed >> 4", "    low, high = packed >> 4, packed & 0xF")]
BUG = True
MAY_FAIL = ["test_pack_puts_even_element_in_low_nibble", "test_unpack_is_exact_inverse_of_pack"]
SELECT = "low_nibble or every_integer_dtype or unpack or pack_rejects or pack_odd or pack_out_of_range"
