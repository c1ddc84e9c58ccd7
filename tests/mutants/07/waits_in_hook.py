"""Each bucket's all-reduce is waited for right after it is launched, inside the hook (serialises communication and compute).
Caught by: test_buckets_launched_during_backward[W2-cap0] ("a hook waited on a collective")."""
SELECT = 'test_buckets_launched_during_backward and W2-cap0'
MESSAGE = 'no overlap: a hook waited on a collective'
MUTATE = [("        self._launched.append((dist.all_reduce(flat, group=self.group, async_op=True), flat))\n",
           "        work = dist.all_reduce(flat, group=self.group, async_op=True)\n        work.wait()\n"
           "        self._launched.append((work, flat))\n")]
