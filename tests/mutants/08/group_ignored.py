"""The layers shard over the world, not over ``group``: W and r from dist.get_world_size() / dist.get_rank().
Caught by: test_group_is_honoured ("the rows of a split over the whole world (W=4), not over the group")."""
SELECT = 'test_group_is_honoured'
MESSAGE = 'not over the group'
MUTATE = [("        W, r = dist.get_world_size(group), dist.get_rank(group)\n        n = _shard_size(linear.out_features, W, \"out_features\")\n",
           "        W, r = dist.get_world_size(), dist.get_rank()\n        n = _shard_size(linear.out_features, W, \"out_features\")\n")]
