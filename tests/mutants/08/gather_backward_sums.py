"""gather_output's backward all-reduces the replicated gradient before taking this rank's block (W times too large).
Caught by: test_column_parallel_gather_output[W2] (the gradient of x "is W=2 times the unsharded one: an all-reduce too many")."""
SELECT = 'test_column_parallel_gather_output and W2'
MESSAGE = 'an all-reduce too many'
MUTATE = [("        n = grad.shape[-1] // W\n        return grad[..., r * n:(r + 1) * n].contiguous(), None\n",
           "        n = grad.shape[-1] // W\n        grad = grad.contiguous().clone()\n        dist.all_reduce(grad, group=ctx.group)\n"
           "        return grad[..., r * n:(r + 1) * n].contiguous(), None\n")]
