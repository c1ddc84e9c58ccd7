"""Every gradient is reduce-scattered at the end of backward (a queued engine callback) rather
than when its unit's gradient is complete: right values, but no communication overlaps the
backward and every unit's full gradient is alive at once (pytorch/pytorch #160320: FSDP2's
reduce-scatters all ran at the end of backward).
Caught by: test_gradients_reduce_scattered_unit_by_unit_during_backward."""
SELECT = 'test_gradients_reduce_scattered'
MESSAGE = 'reduce-scatter deferred'
MUTATE = [("        def hook(leaf):\n            grad = leaf.grad\n            leaf.grad = None\n",
           "        def hook(leaf, grad=None):\n            if grad is None:\n                grad = leaf.grad\n"
           "                leaf.grad = None\n"
           "                self.__dict__.setdefault('_pending', []).append(lambda: hook(leaf, grad))\n"
           "                self._free(i)\n                return\n"),
          ("        self._queued = False\n        for i in range(len(self._flats)):\n",
           "        self._queued = False\n        for run in self.__dict__.pop('_pending', []):\n            run()\n"
           "        for i in range(len(self._flats)):\n")]
