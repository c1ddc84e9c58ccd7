"""Averages by the world's size instead of the group's (dist.get_world_size() without the group).
Caught by: test_group_is_honoured ("divided by the world's size (4), not the group's (2)")."""
SELECT = 'test_group_is_honoured'
MESSAGE = "divided by the world's size"
MUTATE = [("        self.world_size = dist.get_world_size(group)\n", "        self.world_size = dist.get_world_size()\n")]
