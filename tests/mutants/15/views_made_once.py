"""The parameter views (and the leaf over the flat buffer) are made at the first forward and
reused: the buffer is refilled in place, so values stay right, but from the second forward on
the views' backward nodes carry old sequence numbers and the autograd engine runs them last:
every unit's gradient completes, and is reduce-scattered, only at the end of backward
(pytorch/pytorch #160320, the contract's pitfall).
Caught by: test_gradients_reduce_scattered_unit_by_unit_during_backward (second step)."""
SELECT = 'test_gradients_reduce_scattered'
MESSAGE = 'reduce-scatter deferred'
MUTATE = [("            if f is not None:\n                f.set_views(trainable=(k == 0))\n",
           "            if f is not None and not getattr(f, 'made', False):\n                f.made = True\n"
           "                f.set_views(trainable=(k == 0))\n")]
