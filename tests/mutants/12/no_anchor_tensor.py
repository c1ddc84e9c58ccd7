"""No extra tensor requiring grad goes through the Function: when no argument requires grad (a data batch), the
output does not require grad and fn's parameters never learn.
Caught by: test_checkpoint_gradients_equal_a_direct_call[batch-without-grad] ("the output does not require grad")."""
SELECT = 'test_checkpoint_gradients_equal_a_direct_call and batch-without-grad'
MESSAGE = 'the output does not require grad'
MUTATE = [("    anchor = torch.empty(0, requires_grad=True)\n", "    anchor = torch.empty(0)\n")]
