"""Correct, written another way: the gradient is divided by W before the reduce-scatter (not
after), with the list form ``dist.reduce_scatter`` over W chunks of the padded gradient
(``c10d::reduce_scatter_``), and the shard cut with ``torch.chunk`` padded per rank. The
values differ from the reference's only in rounding: it must lose no point."""
MAY_FAIL = []
SELECT = "matches_single_process or step_sends or reduce_scattered or two_backwards or padding"
MUTATE = [
    ("            dist.reduce_scatter_single(out, grad.contiguous(), op=dist.ReduceOp.SUM, group=self.group)\n"
     "            out.div_(self.W)\n",
     "            dist.reduce_scatter(out, list((grad / self.W).contiguous().split(c)), op=dist.ReduceOp.SUM,\n"
     "                               group=self.group)\n"),
]
