"""route takes torch.topk of the probabilities: equal probabilities are not broken toward the lower expert index
(on CPU topk(zeros(8), 2) is [6, 5]).
Caught by: test_route_ties_go_to_the_lower_index ("equal probabilities go to the lower expert index")."""
SELECT = 'test_route_ties_go_to_the_lower_index'
MESSAGE = 'equal probabilities go to the lower expert index'
MUTATE = [("    top, idx = torch.sort(probs, dim=-1, descending=True, stable=True)\n    top, idx = top[:, :k], idx[:, :k]\n",
           "    top, idx = torch.topk(probs, k, dim=-1)\n")]
