"""The column-parallel linear flattens its input with ``x.view(-1, in)`` before the matmul:
a non-contiguous x (a transposed activation, a slice) raises "view size is not compatible
with input tensor's size and stride". Caught by: test_non_contiguous_inputs_and_gradients
(the submission's own "view size is not compatible" error, on that test's case)."""
SELECT = "test_non_contiguous_inputs_and_gradients"
MESSAGE = 'view size is not compatible'
MUTATE = [("        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)\n",
           "        x = copy_to_tp(x, self.group)\n"
           "        y = F.linear(x.view(-1, x.shape[-1]), self.weight, self.bias).view(*x.shape[:-1], -1)\n")]
