"""The unit is gathered again in every pre-forward even though it is already gathered (a
redundant all-gather per unit in forward): right values, a third gather on the wire.
Caught by: test_step_sends_at_most_two_gathers_and_one_reduce_scatter_per_unit."""
SELECT = 'test_step_sends'
MESSAGE = 'too many elements sent'
MUTATE = [("            self._ready(i)\n            if self.prefetch and i + 1 < len(self._units):",
           "            self._ready(i)\n            for f in self._flats[i]:\n                if f is not None:\n"
           "                    f.gather(self.group)\n            if self.prefetch and i + 1 < len(self._units):")]
