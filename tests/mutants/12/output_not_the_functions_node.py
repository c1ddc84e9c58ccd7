"""checkpoint returns the Function's output passed through one more op (* 1.0): the gradients are right, but the
output's grad_fn is a MulBackward0, not the checkpoint's node, and a second copy of the output is made.
Caught by: test_checkpoint_output_is_your_functions_node ("it must be the node of your torch.autograd.Function")."""
SELECT = 'test_checkpoint_output_is_your_functions_node'
MESSAGE = 'it must be the node of your torch.autograd.Function'
MUTATE = [("    return _Checkpoint.apply(fn, anchor, *args)\n", "    return _Checkpoint.apply(fn, anchor, *args) * 1.0\n")]
