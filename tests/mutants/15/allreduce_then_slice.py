"""The gradient is all-reduced in full and this rank's slice taken (deepspeedai/DeepSpeed #156):
right values, 4Ψ(W-1)/W on the wire instead of Ψ(W-1)/W.
Caught by: test_step_sends_at_most_two_gathers_and_one_reduce_scatter_per_unit."""
SELECT = 'test_step_sends'
MESSAGE = 'backward communicates'
MUTATE = [("            dist.reduce_scatter_single(out, grad.contiguous(), op=dist.ReduceOp.SUM, group=self.group)\n",
           "            full = grad.contiguous().clone()\n            dist.all_reduce(full, group=self.group)\n"
           "            out.copy_(full[self.rank * c:(self.rank + 1) * c])\n")]
