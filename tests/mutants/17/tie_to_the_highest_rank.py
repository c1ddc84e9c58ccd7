"""A 1-1 (or 2-2) tie takes the value of the highest rank as the reference, so the lowest ranks get blamed.
Caught by: test_diagnose_designed_trace[tie]."""
SELECT = 'test_diagnose_designed_trace and tie'
MESSAGE = 'ties go to the value of the lowest rank'
MUTATE = [
    ('                    ref = max(counts, key=lambda v: (counts[v], -min(r for r in ranks if vals[r] == v)))\n',
     '                    ref = max(counts, key=lambda v: (counts[v], max(r for r in ranks if vals[r] == v)))\n'),
]
