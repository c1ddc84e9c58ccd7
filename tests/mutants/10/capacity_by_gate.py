"""Capacity keeps, per expert, the assignments with the highest gates (priority by gate), not the first in token order.
Caught by: test_capacity_drops_the_later_tokens ("capacity drops by gate")."""
SELECT = 'test_capacity_drops_the_later_tokens'
MESSAGE = 'capacity drops by gate'
MUTATE = [("            keep = keep & (_positions(hot) < capacity(T, E, self.k, self.capacity_factor))\n",
           "            G = torch.zeros_like(hot).scatter(1, idx, gates.detach())\n"
           "            first = (G[None, :, :] > G[:, None, :]) | ((G[None, :, :] == G[:, None, :])\n"
           "                                                     & (torch.arange(T)[None, :, None] < torch.arange(T)[:, None, None]))\n"
           "            pos = (first & hot.bool()[None, :, :]).sum(1)  # higher gates first, ties by token\n"
           "            keep = keep & (pos < capacity(T, E, self.k, self.capacity_factor))\n")]
