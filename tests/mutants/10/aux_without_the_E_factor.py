"""The load-balancing loss is sum_e f_e * P_e, without Switch's factor E (1/E when balanced, not 1.0).
Caught by: test_load_balancing_loss_matches_switch_formula ("misses the factor E")."""
SELECT = 'test_load_balancing_loss_matches_switch_formula'
MESSAGE = 'misses the factor E'
MUTATE = [("    return num_experts * (f * probs.mean(dim=0)).sum()\n", "    return (f * probs.mean(dim=0)).sum()\n")]
