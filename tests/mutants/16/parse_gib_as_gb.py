"""Bug: binary prefixes read as powers of 1000: "80 GiB" taken for 80e9 bytes.

Source: IEC 80000-13 (Ki, Mi, Gi are powers of 1024); an "80 GB" H100 holds 80 GiB.
Caught by: test_parse_bytes[binary].
"""
SELECT = 'test_parse_bytes and binary'
MESSAGE = 'GiB read as GB'
MUTATE = [
    ('"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50',
     '"Ki": 10**3, "Mi": 10**6, "Gi": 10**9, "Ti": 10**12, "Pi": 10**15'),
]
