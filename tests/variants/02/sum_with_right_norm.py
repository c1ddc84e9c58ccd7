"""Gradients summed over the ranks, never divided by W, but grad_norm (and so clipping) computed
from the average: the bug Adam's scale invariance hides everywhere but where eps is large.
Issue 13 point 11: a Part A test catches it without grad_norm; Part C's memory test (default
eps, exact averages) does not fail on it. Issue "Graders that charge one deviation once": the
averaging test grades it, once; the per-group test (a group with eps=1e-3, where the sum shows)
passes a result that is exactly the summed gradients' replay (at W=2, selected to prove it)."""
BUG = True
MESSAGE = "gradient is W× the average"  # the bug class, named in every failing test
MAY_FAIL = ["test_gradients_are_averaged_not_summed"]
SELECT = "(W4 and (averaged_not_summed or state_is_sharded)) or (W2 and param_groups)"
MUTATE = [
    ("        del flat\n        shard /= W\n", "        del flat\n"),
    ("        sq = (shard.double() ** 2).sum().float().reshape(1)\n",
     "        sq = ((shard.double() / W) ** 2).sum().float().reshape(1)\n"),
]
