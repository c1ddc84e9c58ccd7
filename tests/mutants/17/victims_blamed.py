"""Every rank named by a "missing" finding is a culprit, also those waiting in another collective (the victims
of the rank that left). Caught by: test_diagnose_simulated_hung_jobs."""
SELECT = 'test_diagnose_simulated_hung_jobs'
MESSAGE = 'wrong culprits'
MUTATE = [
    ('        culprits |= {r for r in f["ranks"] if f["kind"] != "missing" or r not in waits}\n',
     '        culprits |= set(f["ranks"])\n'),
]
