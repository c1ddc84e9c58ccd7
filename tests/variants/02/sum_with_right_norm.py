"""Gradients summed over the ranks, never divided by W, but grad_norm (and so clipping) computed
from the average: the bug Adam's scale invariance hides everywhere but where eps is large.
Issue 13 point 11: a Part A test catches it without grad_norm; Part C's memory test (default
eps, exact averages) does not fail on it. The per-group test (a group with eps=1e-3) fails too;
every failing test names the bug class ("gradient is W× the average"), the per-group one at W=2
selected to prove it."""
BUG = True
MESSAGE = "gradient is W× the average"  # the bug class, named in every failing test
MAY_FAIL = ["test_gradients_are_averaged_not_summed", "test_param_groups_with_their_own_lr_and_weight_decay"]
SELECT = "(W4 and (averaged_not_summed or state_is_sharded)) or (W2 and param_groups)"
MUTATE = [
    ("        del flat\n        shard /= W\n", "        del flat\n"),
    ("        sq = (shard.double() ** 2).sum().float().reshape(1)\n",
     "        sq = ((shard.double() / W) ** 2).sum().float().reshape(1)\n"),
]
