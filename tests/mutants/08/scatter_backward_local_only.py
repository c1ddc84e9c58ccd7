"""RowParallelLinear(input_is_parallel=False): backward returns only this rank's block of the input gradient
(shape (..., in/W)), never all-gathered into the full one.
Caught by: test_row_parallel_full_input[W2] (the gradient of x has the wrong shape)."""
SELECT = 'test_row_parallel_full_input and W2'
MUTATE = [("        return _gather_last(grad, ctx.group), None\n",
           "        W, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)\n"
           "        full = torch.zeros(*grad.shape[:-1], grad.shape[-1] * W, dtype=grad.dtype)\n"
           "        full[..., r * grad.shape[-1]:(r + 1) * grad.shape[-1]] = grad\n        return full, None\n")]
