"""MoE combines with detached gates: y is right, but y's gradient never reaches the router (it learns only through
the aux loss).
Caught by: test_moe_gradients_match_dense_reference ("the gradient of y does not reach the router"; at k > 1)."""
SELECT = 'test_moe_gradients_match_dense_reference'
MESSAGE = 'the gradient of y does not reach the router'
MUTATE = [("        table = torch.zeros_like(hot).scatter(1, idx, gates) * keep     # (T, E) kept gates\n        return",
           "        table = torch.zeros_like(hot).scatter(1, idx, gates.detach()) * keep\n        return")]
