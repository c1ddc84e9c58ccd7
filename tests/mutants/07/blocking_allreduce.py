"""A blocking all-reduce per bucket (async_op left False; the returned None is never waited on).
Caught by: test_one_async_collective_per_bucket_each_element_once[W2-cap0] ("blocking call: use async_op=True")."""
SELECT = 'test_one_async_collective_per_bucket_each_element_once and W2-cap0'
MUTATE = [("        self._launched.append((dist.all_reduce(flat, group=self.group, async_op=True), flat))\n",
           "        dist.all_reduce(flat, group=self.group)\n        self._launched.append((None, flat))\n"),
          ("            work.wait()\n", "            work is None or work.wait()\n")]
