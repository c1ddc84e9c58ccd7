"""prefetch=True ignored in forward: every unit is gathered with a blocking call just before it.
Caught by: test_prefetch_launches_the_next_gather_asynchronously."""
SELECT = 'test_prefetch_launches'
MESSAGE = 'no prefetch in forward'
MUTATE = [("            if self.prefetch and i + 1 < len(self._units):\n                self._gather(i + 1, async_op=True)\n", "")]
