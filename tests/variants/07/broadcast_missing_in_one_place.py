"""Bug: the construction broadcast is removed (every rank keeps its own initial weights and
buffers); everything else is the reference.

Issue point (lab 07, "every training test starts the ranks from different weights"): graded
in one place, the broadcast test. Every training test starts the ranks from identical
weights, so equivalence, the sub-group, forward, one collective per bucket, overlap,
``no_sync`` and unused parameters all pass."""
MUTATE = [("                dist.broadcast(t, group_src=0, group=group)\n", "                pass\n")]
BUG = True
MAY_FAIL = ["test_ranks_start_from_rank_0_parameters_and_buffers"]
MESSAGE = "broadcast every parameter and buffer from rank 0"
SELECT = ("start_from_rank_0 or matches_single_process or group_is_honoured or forward_is_the_modules or "
          "mixed_dtypes or one_collective or launched_during or no_sync or unused_parameter")
