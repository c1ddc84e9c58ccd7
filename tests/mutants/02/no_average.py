"""Gradients are summed over the ranks but never divided by W.
Caught by: test_n_not_divisible_by_w_padding_never_leaks[W4]: Adam is nearly scale-invariant, so only
a larger eps (1e-6 there) or the norm (grad_norm, clipping tests) exposes the missing / W."""
MUTATE = [("        del flat\n        shard /= W\n", "        del flat\n")]
