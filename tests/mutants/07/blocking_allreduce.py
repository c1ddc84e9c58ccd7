"""A blocking all-reduce per bucket (async_op left False; the returned None is never waited on).
Caught by: test_buckets_launched_during_backward[W2-cap0] ("no overlap: bucket 0 was sent with a blocking call")."""
SELECT = 'test_buckets_launched_during_backward and W2-cap0'
MESSAGE = 'no overlap: bucket 0 was sent with a blocking call'
MUTATE = [("        self._launched.append((dist.all_reduce(flat, group=self.group, async_op=True), flat))\n",
           "        dist.all_reduce(flat, group=self.group)\n        self._launched.append((None, flat))\n"),
          ("            work.wait()\n", "            work is None or work.wait()\n")]
