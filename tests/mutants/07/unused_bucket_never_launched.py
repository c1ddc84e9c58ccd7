"""A bucket with a parameter that got no gradient is never launched: ranks that used it wait forever for the others.
Caught by: test_unused_parameters_complete_without_a_hang[W2-cap0] (a timeout naming where each rank waited)."""
SELECT = 'test_unused_parameters_complete_without_a_hang and W2-cap0'
MUTATE = [("        while len(self._launched) < len(self._params):  # buckets with an unused parameter\n"
           "            self._launch(len(self._launched))\n", "")]
