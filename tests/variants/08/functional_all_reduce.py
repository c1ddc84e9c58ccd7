"""Correct, written another way: ``g`` (reduce_from_tp) and the backward of ``f`` use the
functional collective ``torch.distributed._functional_collectives.all_reduce`` (out of place,
waited with ``wait_tensor``) instead of ``dist.all_reduce`` on a copy. The contract counts
collectives at the c10d dispatcher, so it is one all-reduce each way like any other: it must
lose no point."""
MAY_FAIL = []
SELECT = "copy_to_tp or reduce_from_tp or mlp or attention or one_all_reduce"
MUTATE = [
    ("        grad = grad.contiguous().clone()\n        dist.all_reduce(grad, group=ctx.group)\n        return grad, None\n",
     "        from torch.distributed import _functional_collectives as fc\n"
     "        g = fc.all_reduce(grad.contiguous(), \"sum\", ctx.group if ctx.group is not None else dist.group.WORLD)\n"
     "        return fc.wait_tensor(g), None\n"),
    ("        out = x.contiguous().clone()\n        dist.all_reduce(out, group=group)\n        return out\n",
     "        from torch.distributed import _functional_collectives as fc\n"
     "        out = fc.all_reduce(x.contiguous(), \"sum\", group if group is not None else dist.group.WORLD)\n"
     "        return fc.wait_tensor(out)\n"),
]
