"""prefetch=True prefetches in forward only: backward gathers each unit on demand.
Caught by: test_prefetch_launches_the_next_gather_asynchronously."""
SELECT = 'test_prefetch_launches'
MESSAGE = 'no prefetch in backward'
MUTATE = [("                if self.prefetch and i >= 1:\n                    self._gather(i - 1, async_op=True)  # BACKWARD_PRE\n", "")]
