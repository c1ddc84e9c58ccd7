"""With prefetch=True forward prefetches the next two units (i+1 and i+2), not one: three
units besides the root are gathered at once. Values stay right; the prefetch bound (the unit
computing and the next one) is exceeded.
Caught by: test_prefetch_holds_at_most_two_units (the tagging probe)."""
SELECT = 'test_prefetch_holds_at_most_two'
MESSAGE = 'prefetch holds more than two units'
MUTATE = [("            if self.prefetch and i + 1 < len(self._units):\n                self._gather(i + 1, async_op=True)\n",
           "            for j in (i + 1, i + 2):\n                if self.prefetch and j < len(self._units):\n"
           "                    self._gather(j, async_op=True)\n")]
