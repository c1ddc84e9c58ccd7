"""copy_to_tp's backward returns this rank's partial input gradient without the all-reduce (Megatron's f half done).
Caught by: test_copy_to_tp_is_identity_forward_and_all_reduce_backward[W2] ("f's backward must all-reduce")."""
SELECT = 'test_copy_to_tp_is_identity_forward_and_all_reduce_backward and W2'
MESSAGE = "f's backward must all-reduce"
MUTATE = [("        grad = grad.contiguous().clone()\n        dist.all_reduce(grad, group=ctx.group)\n        return grad, None\n",
           "        return grad, None\n")]
