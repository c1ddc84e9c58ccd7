"""qkv sharded as one contiguous block of 3d/W rows (rank 0 gets all of q's rows at W=3... and no k or v).
Caught by: test_parallel_attention_matches_the_unsharded_block[W2-causal] ("one contiguous block of 3d/W qkv rows")."""
SELECT = 'test_parallel_attention_matches_the_unsharded_block and W2-causal'
MESSAGE = 'one contiguous block of 3d/W qkv rows'
MUTATE = [("        rows = torch.cat([torch.arange(j * d + r * n, j * d + (r + 1) * n) for j in range(3)])\n",
           "        rows = torch.arange(r * 3 * n, (r + 1) * 3 * n)\n")]
