"""Backward reruns fn under torch.no_grad(): the rerun builds no graph, so nothing is backpropagated and neither the
inputs nor fn's parameters get a gradient.
Caught by: test_checkpoint_gradients_equal_a_direct_call ("no gradient after backward: the recomputation built no
graph (recomputation under no_grad?")."""
SELECT = 'test_checkpoint_gradients_equal_a_direct_call and input-requires-grad'
MESSAGE = 'recomputation under no_grad'
MUTATE = [("            with torch.enable_grad(), _autocast_as(ctx.autocast):\n",
           "            with torch.no_grad(), _autocast_as(ctx.autocast):\n")]
