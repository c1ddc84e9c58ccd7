"""The hooks only count; every bucket is all-reduced in the end-of-backward callback (correct gradients, no overlap).
Caught by: test_buckets_launched_during_backward[W2-cap0] ("no overlap ... all-reduce after backward?")."""
SELECT = 'test_buckets_launched_during_backward and W2-cap0'
MESSAGE = 'no overlap'
MUTATE = [("        while len(self._launched) < len(self._params) and self._pending[len(self._launched)] == 0:\n"
           "            self._launch(len(self._launched))\n", "")]
