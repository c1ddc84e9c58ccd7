"""When every missing rank waits in another collective (a cycle across groups) diagnose names no culprit.
Caught by: test_diagnose_designed_trace[cycle]."""
SELECT = 'test_diagnose_designed_trace and cycle'
MESSAGE = 'a cycle blames every missing rank'
MUTATE = [
    ('    if not culprits:\n        culprits = {r for f in findings if f["kind"] == "missing" for r in f["ranks"]}\n',
     ''),
]
