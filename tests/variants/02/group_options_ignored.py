"""Every element is updated with the optimizer's defaults (lr, betas, eps, weight_decay given
to the constructor), never its param group's own: sharding, clipping and memory are right.
Issue 13 point 2: the bug is graded by the per-group test alone, not by the clipping, memory
or grad-None tests."""
BUG = True
MAY_FAIL = ["test_param_groups_with_their_own_lr_and_weight_decay"]
SELECT = "W2 and (param_groups or clips_by_global_norm or state_is_sharded or grad_none_on_all_ranks)"
MUTATE = [("            g = self.param_groups[gi]\n", "            g = self.defaults  # not the element's group\n")]
