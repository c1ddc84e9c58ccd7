"""``stage_module.zero_grad()`` at the start of run_pipeline: the gradients of the call are right,
but what .grad held before the call is lost (gradients must add to .grad, as backward() does).
Caught by: test_gradients_add_to_what_grad_held_before_the_call[gpipe] ("lost what .grad held")."""
SELECT = 'test_gradients_add_to_what_grad_held_before_the_call'
MESSAGE = 'lost what .grad held before the call'
MUTATE = [("    inputs, outputs, pending = {}, {}, []\n",
           "    stage_module.zero_grad()\n    inputs, outputs, pending = {}, {}, []\n")]
