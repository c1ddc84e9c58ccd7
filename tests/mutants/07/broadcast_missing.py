"""No broadcast at construction: every rank keeps its own initial weights.
Caught by: test_ranks_start_from_rank_0_parameters_and_buffers[W2] ("is this rank's own after construction")."""
SELECT = 'test_ranks_start_from_rank_0_parameters_and_buffers and W2'
MESSAGE = "is this rank's own after construction"
MUTATE = [("                dist.broadcast(t, group_src=0, group=group)\n", "                pass\n")]
