"""Bug: ownership uses the world rank (dist.get_rank()) instead of the rank within ``group``
(the mutant global_rank_ownership); the average, the norm and clipping use ``group``.

Issue "Graders that charge one deviation once": graded in one place, Part A's group test. Part
B's group test grades where the norm's squares are summed, on the subgroup whose ranks within
the group are its world ranks, where ownership by world rank cannot matter."""
MUTATE = [("        self.rank = dist.get_rank(group)\n", "        self.rank = dist.get_rank()\n")]
BUG = True
MESSAGE = "group not honoured"
MAY_FAIL = ["test_group_is_honoured"]
SELECT = "group_is_honoured or grad_norm_and_clipping_honour_group"
