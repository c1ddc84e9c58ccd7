"""One-change probe (issue "Graders that charge one deviation once"): the load-balancing loss with Hugging Face's
normalisation of f_e (transformers' ``load_balancing_loss_func`` averages the (T, k, E) one-hot assignments over the
T tokens and sums over the k slots): f_e is a fraction of the T tokens, not of the T*k assignments, so the aux loss
is k times the contract's (k at balance, not 1.0), in ``load_balancing_loss`` and in ExpertParallelMoE's union
statistics alike. ``y`` and every gradient of a loss on ``y`` are right: only the tests that grade the aux loss may
fail, and they must name the normalisation (at k = 1 both conventions agree)."""
BUG = True
MAY_FAIL = ["test_load_balancing_loss_matches_switch_formula", "test_moe_aux_loss_is_the_routed_load_balancing_loss",
            "test_expert_parallel_aux_loss_is_the_unions"]
MESSAGE = "of T*k, not T"
SELECT = ("load_balancing_loss or moe_ or capacity_drops or capacity_gradients or expert_parallel_equals "
          "or aux_loss")
MUTATE = [("    f = counts / max(flat.numel(), 1)\n", "    f = counts / max(expert_idx.shape[0], 1)     # over T\n"),
          ("        f = every[:, 1:1 + E].sum(0) / (T_all * k)\n", "        f = every[:, 1:1 + E].sum(0) / T_all\n")]
