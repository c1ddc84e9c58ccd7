"""After capacity drops a token's remaining gates are renormalised to sum to 1 (a dropped assignment's weight moves to
the token's other experts).
Caught by: test_capacity_drops_the_later_tokens ("gates renormalised after drops")."""
SELECT = 'test_capacity_drops_the_later_tokens'
MESSAGE = 'gates renormalised after drops'
MUTATE = [("        table = torch.zeros_like(hot).scatter(1, idx, gates) * keep     # (T, E) kept gates\n",
           "        table = torch.zeros_like(hot).scatter(1, idx, gates) * keep     # (T, E) kept gates\n"
           "        table = table / table.sum(-1, keepdim=True).clamp_min(1e-12)\n")]
