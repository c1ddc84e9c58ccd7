"""A reduce-scatter of zeros beside the real exchange: each unit's gradient is all-gathered (the
list ``dist.all_gather``) and summed, and a reduce-scatter of a zero tensor of the right size is
issued so that the counted collectives show a reduce-scatter of every unit's flat in backward.
Values stay right.
Caught by: test_step_sends_at_most_two_gathers_and_one_reduce_scatter_per_unit (the
reduce-scatter inputs must carry the rank's gradient: their sum is the gradient's)."""
SELECT = 'test_step_sends'
MESSAGE = 'reduce-scatter without the gradients'
MUTATE = [("            dist.reduce_scatter_single(out, grad.contiguous(), op=dist.ReduceOp.SUM, group=self.group)\n",
           "            dist.reduce_scatter_single(out, torch.zeros_like(grad), op=dist.ReduceOp.SUM, group=self.group)\n"
           "            parts = [torch.empty_like(grad) for _ in range(self.W)]\n"
           "            dist.all_gather(parts, grad.contiguous(), group=self.group)\n"
           "            out.copy_(torch.stack(parts).sum(0)[self.rank * c:(self.rank + 1) * c])\n")]
