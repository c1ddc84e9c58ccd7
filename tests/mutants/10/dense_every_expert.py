"""Every expert runs on every token and the unrouted outputs are masked to 0: the right values and gradients,
E/k times the FLOPs.
Caught by: test_moe_flops_grow_with_k_not_E ("a dense 'run every expert on every token and mask' costs E/k")."""
SELECT = 'test_moe_flops_grow_with_k_not_E'
MESSAGE = "a dense 'run every expert on every token and mask' costs E/k"
MUTATE = [("        rows = keep[:, j].nonzero().squeeze(1)\n        out = expert(x[rows]).float() * table[rows, j].unsqueeze(1)\n        y = y.index_add(0, rows, out)\n",
           "        y = y + expert(x).float() * (table[:, j] * keep[:, j]).unsqueeze(1)\n")]
