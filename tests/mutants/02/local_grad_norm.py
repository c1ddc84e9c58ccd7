"""The clipping norm is this rank's shard norm only (no all-reduce of the squares).
Caught by: test_group_is_honoured (it checks grad_norm; also test_clips_by_global_norm_across_shards)."""
MUTATE = [("        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.group)\n", "")]
