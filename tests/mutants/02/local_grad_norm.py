"""The clipping norm is this rank's shard norm only (no all-reduce of the squares).
Caught by: test_clips_by_global_norm_across_shards[W2] (and test_grad_norm_and_clipping_honour_group: the squares
summed over the group's ranks; the W=1 tests cannot see it, tests/variants/02/local_norm_in_one_place.py)."""
SELECT = 'test_clips_by_global_norm_across_shards and W2'
MESSAGE = 'not the global 2-norm'
MUTATE = [("        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.group)\n", "")]
