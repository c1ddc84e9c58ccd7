"""Correct, written another way: the all-gather is the functional collective's ``_out`` op
(``torch.ops._c10d_functional.all_gather_into_tensor_out``, then ``wait_tensor``), writing
straight into the flat buffer, always blocking (prefetch launches it and waits at once before
the unit: still launched before the previous unit's compute in forward). It must lose no
point on the tests it runs."""
MAY_FAIL = []
SELECT = "matches_single_process or step_sends or reduce_scattered or only_shards or no_grad or full_parameters_resident or prefetch_holds"
MUTATE = [
    ("        self.work = dist.all_gather_single(self.full.data, self.shard.detach(), group=group, async_op=async_op)\n"
     "        if not async_op:\n            self.work = None\n",
     "        import torch.distributed.distributed_c10d as c10d\n"
     "        g = group if group is not None else c10d._get_default_group()\n"
     "        out = self.full.data\n"
     "        torch.ops._c10d_functional.all_gather_into_tensor_out(self.shard.detach(), self.W, g.group_name, out=out)\n"
     "        torch.ops._c10d_functional.wait_tensor(out)\n        self.work = None\n"),
]
