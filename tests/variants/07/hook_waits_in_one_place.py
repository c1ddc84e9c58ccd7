"""Bug: each bucket's all-reduce is waited for inside the hook that launched it (the hook
blocks on its own collective: communication no longer overlaps the rest of backward);
gradients, buckets, launches and ``no_sync`` are the reference's.

Issue point (lab 07, "a blocking all-reduce inside the hook is reported as a no_sync
failure"): an overlap fault, graded and named only by the overlap test
(test_buckets_launched_during_backward); the ``no_sync`` and unused-parameter tests pass."""
MUTATE = [("        self._launched.append((dist.all_reduce(flat, group=self.group, async_op=True), flat))\n",
           "        work = dist.all_reduce(flat, group=self.group, async_op=True)\n        work.wait()\n"
           "        self._launched.append((work, flat))\n")]
BUG = True
MAY_FAIL = ["test_buckets_launched_during_backward"]
MESSAGE = "no overlap"
SELECT = "one_collective or launched_during or no_sync or unused_parameter or accumulated_gradient"
