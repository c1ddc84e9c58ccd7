"""Ownership uses the world rank (dist.get_rank()) instead of the rank within `group`.
Caught by: test_group_is_honoured, alone: Part B's group test grades the norm on the subgroup [0, 1],
whose ranks within the group are its world ranks (tests/variants/02/world_rank_ownership_in_one_place.py)."""
SELECT = 'test_group_is_honoured'
MESSAGE = 'group not honoured'
MUTATE = [("        self.rank = dist.get_rank(group)\n", "        self.rank = dist.get_rank()\n")]
