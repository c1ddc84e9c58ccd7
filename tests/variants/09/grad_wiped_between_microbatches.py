"""One-change probe (issue "Graders that charge one deviation once", lab 09): every parameter's
.grad set to None before each microbatch's backward (NVIDIA-NeMo/Automodel#3530): the loss is
right, .grad ends with the last microbatch's part only (and loses what it held before the call).
Only the tests of the gradient values and of their accumulation may charge it: the schedule,
messages, groups, completion and memory tests run on identical microbatches and compare
gradients up to a positive factor, so the lost parts cannot matter there."""
BUG = True
MAY_FAIL = ["test_loss_and_gradients_equal_one_process", "test_gradients_add_to_what_grad_held_before_the_call",
            "test_every_microbatch_adds_to_the_gradient"]
MESSAGE = ".grad was wiped"
SELECT = ("loss_and_gradients and (p2-M4 or gpipe-p4) or gradients_add or every_microbatch or executes or "
          "point_to_point or shape_change or frees and p4-M8")
MUTATE = [("            y = outputs.pop(m)\n",
           "            for q in stage_module.parameters():\n                q.grad = None\n"
           "            y = outputs.pop(m)\n")]
