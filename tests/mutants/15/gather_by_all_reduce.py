"""The all-gather is emulated by an all-reduce: each rank zeroes the flat buffer, writes its
shard at elements [r*c, (r+1)*c) and all-reduces the buffer (SUM), as gathers were written
before gloo had an all-gather into one tensor. Values stay right, but no all-gather fills the
buffer: the contract's tagging probe sees no full parameters gathered (and the all-reduce moves
2x the bytes of an all-gather).
Caught by: test_full_parameters_resident_one_unit_at_a_time (full parameters not seen gathered)."""
SELECT = 'test_full_parameters_resident'
MESSAGE = 'full parameters not seen gathered'
MUTATE = [("        self.work = dist.all_gather_single(self.full.data, self.shard.detach(), group=group, async_op=async_op)\n",
           "        r = dist.get_rank(group)\n"
           "        self.full.data.zero_()\n"
           "        self.full.data[r * c:(r + 1) * c] = self.shard.detach()\n"
           "        self.work = dist.all_reduce(self.full.data, group=group, async_op=async_op)\n")]
