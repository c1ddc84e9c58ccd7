"""Gradients are summed over the ranks but never divided by W.
Caught by: test_gradients_are_averaged_not_summed[W2] ("gradient is W× the average"): Adam is nearly
scale-invariant, so only a large eps (0.1 there; 1e-3 in one group of the per-group test) or the
norm (Part B's grad_norm checks, which name it too) exposes the missing / W."""
SELECT = 'test_gradients_are_averaged_not_summed and W2'
MUTATE = [("        del flat\n        shard /= W\n", "        del flat\n")]
