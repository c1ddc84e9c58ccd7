"""no_sync() does not switch the hooks off: every accumulation step still all-reduces (and averages).
Caught by: test_no_sync_sends_nothing_and_the_next_backward_averages_the_sum[W2] ("inside no_sync() the DDP communicated")."""
SELECT = 'test_no_sync_sends_nothing_and_the_next_backward_averages_the_sum and W2'
MESSAGE = 'inside no_sync() the DDP communicated'
MUTATE = [("        old, self._sync = self._sync, False\n", "        old = self._sync\n")]
