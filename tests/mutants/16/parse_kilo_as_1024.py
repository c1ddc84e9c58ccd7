"""Bug: K read as 1024 (JEDEC's KB); the contract's K is 1000 like k, and 1024 is KiB.

Source: JEDEC JESD100B.01 (KB = 1024 bytes) against SI/IEC; lab-contracts.md note 8.
Caught by: test_parse_bytes[decimal].
"""
SELECT = 'test_parse_bytes and decimal'
MESSAGE = 'K read as 1024'
MUTATE = [
    ('"k": 10**3, "K": 10**3,',
     '"k": 10**3, "K": 2**10,'),
]
