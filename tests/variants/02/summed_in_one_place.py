"""Bug: gradients summed over the ranks, never divided by W, and grad_norm the norm of that sum
(the mutant no_average); nothing else.

Issue "Graders that charge one deviation once": graded in one place, the averaging test (eps=0.1).
Part B's tests (grad_norm W× too large, clipping at the sum's norm) and the per-group test (a
group with eps=1e-3) pass a result that is exactly the summed gradients' replay: clipping and
per-group options are right for the gradient this code averaged."""
MUTATE = [("        del flat\n        shard /= W\n", "        del flat\n")]
BUG = True
MESSAGE = "gradient is W× the average"
MAY_FAIL = ["test_gradients_are_averaged_not_summed"]
SELECT = ("W2 and (averaged_not_summed or param_groups or clips_by_global_norm or no_clipping) "
          "or grad_norm_and_clipping_honour_group")
