"""The root's gathered buffer is never freed: not after its gradient is reduce-scattered, not at
the end of backward (refilled at every gather, so values stay right). Full parameters are left
behind when ``loss.backward()`` returns (the contract: 0 bytes, the root's included).
Caught by: test_full_parameters_resident_one_unit_at_a_time (bytes held when backward returns)."""
SELECT = 'test_full_parameters_resident'
MESSAGE = 'full parameters kept after backward'
MUTATE = [("            if f is not None and not f.gathered:\n", "            if f is not None and f.work is None:  # refilled each time (unless a prefetch is in flight)\n"),
          ("                f.shard.grad.add_(out)\n            self._free(i)\n",
           "                f.shard.grad.add_(out)\n            if i < len(self._units):\n                self._free(i)\n"),
          ("        for i in range(len(self._flats)):\n            self._free(i)\n\n    def _queue_end",
           "        for i in range(len(self._flats) - 1):\n            self._free(i)\n\n    def _queue_end")]
