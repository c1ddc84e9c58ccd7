"""The shard index is the global rank, not the rank in ``group`` (``dist.get_rank()`` without the
group): inside a subgroup of ranks 1..W-1, group rank r cuts elements [(r+1)*c, (r+2)*c) of the
group's padded flat (the last rank gets an empty or wrong shard). A real bug class of subgroup
code: pytorch/pytorch #56882 (global vs group rank in ``new_group`` users), the reason torch 2.x
added ``group_src``/``group_dst`` and ``dist.get_group_rank``.
Caught by: test_group_of_ranks_1_to_W_minus_1."""
SELECT = 'test_group_of_ranks'
MESSAGE = 'group: shard 0 of group rank'
MUTATE = [("        self.rank = dist.get_rank(group)\n", "        self.rank = dist.get_rank()\n")]
