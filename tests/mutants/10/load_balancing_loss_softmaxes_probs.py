"""load_balancing_loss applies a softmax to ``probs`` (as if they were logits): P_e is the mean of
softmax(softmax(logits)), a loss close to 1 whatever the routing, and its gradient is damped.
Caught by: test_load_balancing_loss_matches_switch_formula ("computed on softmax(softmax(logits))")."""
SELECT = 'test_load_balancing_loss_matches_switch_formula'
MESSAGE = 'the aux loss is computed on softmax(softmax(logits))'
MUTATE = [("    return num_experts * (f * probs.mean(dim=0)).sum()\n",
           "    return num_experts * (f * torch.softmax(probs, dim=-1).mean(dim=0)).sum()\n")]
