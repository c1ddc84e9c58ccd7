"""route returns the top-k probabilities themselves as gates, not renormalised to sum to 1 over the k chosen.
Caught by: test_route_matches_float64_reference ("not renormalised to sum to 1 over the k chosen")."""
SELECT = 'test_route_matches_float64_reference'
MESSAGE = 'not renormalised to sum to 1 over the k chosen'
MUTATE = [("    return idx, top / top.sum(dim=-1, keepdim=True)\n", "    return idx, top\n")]
