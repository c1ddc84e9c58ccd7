"""Each microbatch's loss is backpropagated whole: the returned loss and every gradient are M times the mean's.
Caught by: test_loss_and_gradients_equal_one_process[1f1b-p2-M4] ("the sum over the microbatches instead of the mean")."""
MESSAGE = 'the sum over the microbatches instead of the mean'
SELECT = 'test_loss_and_gradients_equal_one_process and 1f1b-p2-M4'
MUTATE = [("                loss = loss_fn(y, targets[m]) / M\n", "                loss = loss_fn(y, targets[m])\n")]
