"""reduce_from_tp all-reduces x in place and returns it: the caller's tensor is overwritten with the sum.
Caught by: test_reduce_from_tp_is_all_reduce_forward_and_identity_backward[W2] ("reduce_from_tp overwrote x with the sum")."""
SELECT = 'test_reduce_from_tp_is_all_reduce_forward_and_identity_backward and W2'
MESSAGE = 'reduce_from_tp overwrote x'
MUTATE = [("    @staticmethod\n    def forward(ctx, x, group):\n        out = x.contiguous().clone()\n        dist.all_reduce(out, group=group)\n        return out\n",
           "    @staticmethod\n    def forward(ctx, x, group):\n        out = x if x.is_contiguous() else x.contiguous()\n        dist.all_reduce(out, group=group)\n"
           "        if out is not x:\n            x.copy_(out)\n        ctx.mark_dirty(x)\n        return x\n")]
