"""Averages by the world's size instead of the group's (dist.get_world_size() without the group).
Caught by: test_group_is_honoured ("group [0, 1] of W=4")."""
SELECT = 'test_group_is_honoured'
MUTATE = [("        self.world_size = dist.get_world_size(group)\n", "        self.world_size = dist.get_world_size()\n")]
