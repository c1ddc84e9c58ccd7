"""The clipping norm is this rank's shard norm only (no all-reduce of the squares).
Caught by: test_clips_by_global_norm_across_shards[W2] (and test_grad_norm_is_set_without_clipping)."""
SELECT = 'test_clips_by_global_norm_across_shards and W2'
MUTATE = [("        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.group)\n", "")]
