"""MoE computes the aux loss from detached router logits: its value is right, but it trains nothing (with k = 1
the router then learns nothing at all).
Caught by: test_moe_aux_loss_gradient_reaches_the_router ("the aux loss's gradient does not reach the router")."""
SELECT = 'test_moe_aux_loss_gradient_reaches_the_router'
MESSAGE = "the aux loss's gradient does not reach the router"
MUTATE = [("        aux = load_balancing_loss(torch.softmax(logits.float(), dim=-1), idx, E)\n",
           "        aux = load_balancing_loss(torch.softmax(logits.detach().float(), dim=-1), idx, E)\n")]
