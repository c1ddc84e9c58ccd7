"""diagnose lines entries up by their record id (the rank's own call order) instead of (pg_name, seq): ranks that
interleave two groups' collectives differently look mismatched (the trap fr_trace avoids by matching per group).
Caught by: test_diagnose_designed_trace[interleaved]."""
SELECT = 'test_diagnose_designed_trace and interleaved'
MESSAGE = 'entries match by (pg_name, seq)'
MUTATE = [
    ('            key = (pg, e["collective_seq_id"], rank)\n',
     '            key = (pg, e["record_id"] + 1, rank)\n'),
]
