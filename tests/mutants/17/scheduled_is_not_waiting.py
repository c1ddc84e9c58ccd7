"""Only "started" entries count as waiting: a rank whose collective is enqueued but not started ("scheduled")
is blamed as if it waited nowhere. Caught by: test_diagnose_designed_trace[scheduled]."""
SELECT = 'test_diagnose_designed_trace and scheduled'
MESSAGE = "a 'scheduled' entry waits too"
MUTATE = [
    ('            if e["state"] != "completed":\n                waits.add(rank)\n',
     '            if e["state"] == "started":\n                waits.add(rank)\n'),
]
