"""The experts' outputs are summed without their gate weights (y = sum_j expert_j(x)).
Caught by: test_moe_matches_dense_reference ("combine without the gate weight")."""
SELECT = 'test_moe_matches_dense_reference'
MESSAGE = 'combine without the gate weight'
MUTATE = [("        out = expert(x[rows]).float() * table[rows, j].unsqueeze(1)\n",
           "        out = expert(x[rows]).float() + 0 * table[rows, j].unsqueeze(1)\n")]
