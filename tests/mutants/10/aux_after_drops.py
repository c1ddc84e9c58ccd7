"""MoE's aux loss counts f_e over the assignments kept after capacity drops, not over the routed ones.
Caught by: test_moe_aux_loss_is_the_routed_load_balancing_loss ("the aux loss counts the assignments after capacity
drops"; its last case drops some)."""
SELECT = 'test_moe_aux_loss_is_the_routed_load_balancing_loss'
MESSAGE = 'the aux loss counts the assignments after capacity drops'
MUTATE = [("        table = torch.zeros_like(hot).scatter(1, idx, gates) * keep     # (T, E) kept gates\n",
           "        table = torch.zeros_like(hot).scatter(1, idx, gates) * keep     # (T, E) kept gates\n"
           "        aux = E * (keep.float().sum(0) / (T * self.k) * torch.softmax(logits.float(), dim=-1).mean(0)).sum()\n")]
