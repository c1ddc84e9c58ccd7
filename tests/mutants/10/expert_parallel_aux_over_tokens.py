"""ExpertParallelMoE's union statistics normalise f_e by the union's T tokens, not its T*k assignments (Hugging
Face's convention, k times the contract's aux loss), while load_balancing_loss and MoE follow the contract.
Caught by: test_expert_parallel_aux_loss_is_the_unions ("of T*k, not T")."""
SELECT = 'test_expert_parallel_aux_loss_is_the_unions and W2'
MESSAGE = 'of T*k, not T'
MUTATE = [("        f = every[:, 1:1 + E].sum(0) / (T_all * k)\n", "        f = every[:, 1:1 + E].sum(0) / T_all\n")]
