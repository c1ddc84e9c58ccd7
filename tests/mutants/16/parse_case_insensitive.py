"""Bug: units read case-insensitively: "80 gb" accepted as 80 GB ("mb" would be a megabyte,
though m is milli).

Source: SI prefixes are case-sensitive (m milli, M mega); lab-contracts.md note 8 ("mb is not
a megabyte").
Caught by: test_parse_bytes_refusals.
"""
SELECT = 'test_parse_bytes_refusals'
MESSAGE = 'lower-case prefix accepted'
MUTATE = [
    ('    m = _BYTES.fullmatch(text)\n',
     '    m = _BYTES.fullmatch(text) or _BYTES.fullmatch(text.upper().replace("BIT", "bit"))\n'),
]
