"""One-change probe (issue "Graders that charge one deviation once", lab 09): each microbatch
backpropagates ``L_m`` instead of ``L_m / M`` while the returned loss is still the mean ``(1/M)
sum_m L_m``: every gradient is M times the mean loss's, and the loss looks right (the silent
form of the bug; the mutant ``loss_not_divided_by_m`` returns the sum too). Only the tests that
grade the loss and gradient values may charge it; the schedule a stage ran, point-to-point
messages, sub-groups, completion without deadlock, a shape change and activation memory are
graded on their own evidence (gradients equal to the model's up to one positive factor)."""
BUG = True
MAY_FAIL = ["test_loss_and_gradients_equal_one_process"]
MESSAGE = "the sum over the microbatches instead of the mean"
MUTATE = [("                loss = loss_fn(y, targets[m]) / M\n", "                loss = loss_fn(y, targets[m])\n"),
          ("    return total if last else None\n", "    return total / M if last else None\n")]
