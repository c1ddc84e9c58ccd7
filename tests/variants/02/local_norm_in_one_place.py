"""Bug: the clipping norm (and grad_norm) is this rank's shard norm only: no all-reduce of the
squares (the mutant local_grad_norm).

Issue "Graders that charge one deviation once": graded where the norm's span is the property,
the global-norm clipping test and Part B's group test (the squares summed over the group's
ranks). The grad_norm-without-clipping test (is grad_norm set when max_grad_norm is None?) and
the clip-only-some-steps test (is the coefficient clamped per step?) run at W=1, where a shard
is the whole gradient: they pass."""
MUTATE = [("        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.group)\n", "")]
BUG = True
MESSAGE = "not the global 2-norm"
MAY_FAIL = ["test_clips_by_global_norm_across_shards", "test_grad_norm_and_clipping_honour_group"]
SELECT = "(clips_by_global_norm and W2) or grad_norm_and_clipping_honour_group or grad_norm_is_set or clips_only"
