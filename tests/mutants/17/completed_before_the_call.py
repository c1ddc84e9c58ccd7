"""The recorder marks an entry "completed" when it records it, before the call runs: a collective that times
out looks finished in the dump. Caught by: test_recorder_real_hang_dumps_name_the_culprit."""
SELECT = 'test_recorder_real_hang_dumps_name_the_culprit and skip'
MESSAGE = "a timed-out collective must stay 'started'"
MUTATE = [
    ('"output_dtypes": _dtypes(outs), "state": "started"}\n',
     '"output_dtypes": _dtypes(outs), "state": "completed"}\n'),
]
