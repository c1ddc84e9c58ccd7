"""Capacity queues every token's first choice before any second choice (GShard's slot priority): a token's slot j
changes its place, against the contract's token order.
Caught by: test_capacity_drops_the_later_tokens ("queues all first choices before the second choices")."""
SELECT = 'test_capacity_drops_the_later_tokens'
MESSAGE = 'queues all first choices before the second choices'
MUTATE = [("            keep = keep & (_positions(hot) < capacity(T, E, self.k, self.capacity_factor))\n",
           "            slot = torch.zeros_like(hot).scatter(1, idx, torch.arange(self.k, dtype=hot.dtype).expand(T, self.k))\n"
           "            key = slot * T + torch.arange(T, dtype=hot.dtype)[:, None]\n"
           "            pos = ((key[None, :, :] < key[:, None, :]) & hot.bool()[None, :, :]).sum(1)  # slot-major\n"
           "            keep = keep & (pos < capacity(T, E, self.k, self.capacity_factor))\n")]
