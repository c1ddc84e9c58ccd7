"""train_step never calls optimizer.zero_grad: every step's gradients add to what .grad held before (the last step's,
or stale values), so the updates are wrong from the first step on.
Caught by: test_train_step_matches_a_float64_reference ("each step starts from optimizer.zero_grad")."""
SELECT = 'test_train_step_matches_a_float64_reference and cross_entropy-fp16'
MESSAGE = 'zero_grad missing?'
MUTATE = [("    optimizer.zero_grad(set_to_none=True)\n    with torch.autocast", "    with torch.autocast")]
