"""A bucket with a parameter that got no gradient is never launched: ranks that used it wait forever for the others,
or pair it with the others' next collective (a size mismatch).
Caught by: test_unused_parameters_complete_without_a_hang[W2-cap0] ("the ranks' collectives fell out of step with unused parameters": a hang, or here a gloo size mismatch)."""
SELECT = 'test_unused_parameters_complete_without_a_hang and W2-cap0'
MESSAGE = 'fell out of step with unused parameters'
MUTATE = [("        while len(self._launched) < len(self._params):  # buckets with an unused parameter\n"
           "            self._launch(len(self._launched))\n", "")]
