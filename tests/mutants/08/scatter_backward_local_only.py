"""RowParallelLinear(input_is_parallel=False): backward returns only this rank's block of the input gradient
(in a full-size tensor, zeros elsewhere), never all-gathered into the full one.
Caught by: test_row_parallel_full_input[W2] ("the gradient of x holds only this rank's columns ... must all-gather")."""
SELECT = 'test_row_parallel_full_input and W2'
MESSAGE = "must all-gather the blocks' gradients"
MUTATE = [("        return _gather_last(grad, ctx.group), None\n",
           "        W, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)\n"
           "        full = torch.zeros(*grad.shape[:-1], grad.shape[-1] * W, dtype=grad.dtype)\n"
           "        full[..., r * grad.shape[-1]:(r + 1) * grad.shape[-1]] = grad\n        return full, None\n")]
