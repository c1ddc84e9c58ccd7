"""W and r come from the world (dist.get_world_size() / dist.get_rank()), not from ``group``: in a sub-group of 2 of
a world of 4 each rank takes the wrong experts and the wrong splits.
Caught by: test_group_is_honoured ("every collective is issued on group": wrong values or a rank's error)."""
SELECT = 'test_group_is_honoured'
MESSAGE = 'every collective is issued on group'
MUTATE = [("        W, r = dist.get_world_size(group), dist.get_rank(group)\n        E = len(moe.experts)\n",
           "        W, r = dist.get_world_size(), dist.get_rank()\n        E = len(moe.experts)\n"),
          ("        W, r = dist.get_world_size(group), dist.get_rank(group)\n        T_r, n = x.shape[0], E // W\n",
           "        W, r = dist.get_world_size(), dist.get_rank()\n        T_r, n = x.shape[0], E // W\n")]
