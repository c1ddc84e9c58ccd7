"""Ownership uses the world rank (dist.get_rank()) instead of the rank within `group`.
Caught by: test_group_is_honoured (and test_grad_norm_and_clipping_honour_group, also "group not honoured")."""
SELECT = 'test_group_is_honoured'
MUTATE = [("        self.rank = dist.get_rank(group)\n", "        self.rank = dist.get_rank()\n")]
