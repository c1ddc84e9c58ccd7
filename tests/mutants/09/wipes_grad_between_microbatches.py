"""Every parameter's .grad set to None before each microbatch's backward (NVIDIA-NeMo/Automodel#3530:
stages re-initialised between microbatches ran ``param.grad = None``, so only the last microbatch
trained the model while the loss looked right): .grad ends with one microbatch's part only.
Caught by: test_every_microbatch_adds_to_the_gradient[gpipe] ("wiped between microbatches")."""
SELECT = 'test_every_microbatch_adds_to_the_gradient'
MESSAGE = 'wiped between microbatches'
MUTATE = [("            y = outputs.pop(m)\n",
           "            for q in stage_module.parameters():\n                q.grad = None\n"
           "            y = outputs.pop(m)\n")]
