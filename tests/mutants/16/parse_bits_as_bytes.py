"""Bug: b, bit and bits read as bytes: a NIC's "400 Gb/s" taken for 400 GB/s.

Source: line rates are quoted in bits per second (InfiniBand NDR: 400 Gb/s = 50 GB/s), bus
bandwidths in bytes per second (nccl-tests' GB/s).
Caught by: test_parse_bytes[bits].
"""
SELECT = 'test_parse_bytes and bits'
MESSAGE = 'bits read as bytes'
MUTATE = [
    ('"b": Decimal("0.125"), "bit": Decimal("0.125"), "bits": Decimal("0.125")',
     '"b": Decimal(1), "bit": Decimal(1), "bits": Decimal(1)'),
]
