"""Bug: QuantizedLinear.forward adds the bias twice: it calls F.linear(x, W_hat, bias), which
already adds it, and then adds the bias again (a common slip when porting ``x @ W.T + b`` to
``F.linear``). Layers without a bias are right.

Killed by: test_from_linear_forward_equals_x_times_dequantized_weight (the -bias cases) and
test_weight_storage_is_out_in_bits_over_8_plus_scales (its output check), each naming it.
"""
SELECT = 'test_from_linear_forward_equals_x_times_dequantized_weight'
MESSAGE = 'bias added twice'
MUTATE = [
    ("        y = x @ self.weight().to(x.dtype).T\n",
     "        y = torch.nn.functional.linear(x, self.weight().to(x.dtype),\n"
     "                                       None if self.bias is None else self.bias.to(x.dtype))\n"),
]
