"""Attention heads assigned round-robin (rank r gets heads r, r+W, ...) instead of the block [r*H/W, (r+1)*H/W);
proj keeps its block of columns, so the heads no longer meet their own proj columns.
Caught by: test_parallel_attention_matches_the_unsharded_block[W2-causal] ("heads assigned round-robin")."""
SELECT = 'test_parallel_attention_matches_the_unsharded_block and W2-causal'
MESSAGE = 'heads assigned round-robin'
MUTATE = [("        rows = torch.cat([torch.arange(j * d + r * n, j * d + (r + 1) * n) for j in range(3)])\n",
           "        D = d // n_heads\n        rows = torch.cat([torch.arange(j * d + hd * D, j * d + (hd + 1) * D) for j in range(3)\n"
           "                          for hd in range(r, n_heads, W)])\n")]
