"""Bug: element 2i packed into the HIGH nibble ([1, 2] -> 0x12); unpack swapped to match,
so the round trip still works but the format differs from the contract's.

Caught by: test_pack_puts_even_element_in_low_nibble.
"""
SELECT = 'test_pack_puts_even_element_in_low_nibble'
MESSAGE = 'nibble order swapped'
MUTATE = [("    return c[..., 0::2] | (c[..., 1::2] << 4)", "    return (c[..., 0::2] << 4) | c[..., 1::2]"),
          ("    low, high = packed & 0xF, packed >> 4", "    low, high = packed >> 4, packed & 0xF")]
