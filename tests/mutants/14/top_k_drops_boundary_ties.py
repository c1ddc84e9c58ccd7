"""top-k keeps exactly k token indices (torch.topk's indices) instead of every token tied with the k-th
largest logit (HF's TopKLogitsWarper and vLLM keep ties).
Caught by: test_top_k_keeps_ties_at_the_boundary ("ties at the boundary")."""
SELECT = 'test_top_k_keeps_ties_at_the_boundary'
MESSAGE = 'ties at the boundary'
MUTATE = [('        z = z.masked_fill(z < kth, -math.inf)\n', '        z = z.masked_fill(~torch.zeros_like(z, dtype=torch.bool).scatter(-1, z.topk(int(top_k), dim=-1).indices, True),\n                          -math.inf)                      # bug: exactly k indices\n')]
