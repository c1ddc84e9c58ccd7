"""Bug: QuantizedLinear(bits=4) stores the uint8 codes unpacked, one per byte: twice the
contract's out*in/2 bytes.

Caught by: test_weight_storage_is_out_in_bits_over_8_plus_scales.
"""
SELECT = 'test_weight_storage_is_out_in_bits_over_8_plus_scales and bits4-g128'
MESSAGE = 'int4 codes must be packed two per byte'
MUTATE = [
    ("            self.register_buffer(\"qweight\", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))",
     "            self.register_buffer(\"qweight\", torch.zeros(out_features, in_features, dtype=torch.uint8))"),
    ("            q.qweight.copy_(pack_int4(codes))", "            q.qweight.copy_(codes)"),
    ("        codes = self.qweight if self.bits == 8 else unpack_int4(self.qweight)", "        codes = self.qweight"),
]
