"""Gradients are summed over the ranks but never divided by W.
Caught by: test_gradients_are_averaged_not_summed[W2] ("gradient is W× the average"): Adam is nearly
scale-invariant, so only a large eps (0.1 there) or the norm exposes the missing / W. Every other test
(the per-group test's eps=1e-3 group, Part B's grad_norm checks) passes a result that is exactly the
summed gradients' replay: the bug costs the averaging test's points, once."""
SELECT = 'test_gradients_are_averaged_not_summed and W2'
MESSAGE = 'gradient is W× the average'
MUTATE = [("        del flat\n        shard /= W\n", "        del flat\n")]
