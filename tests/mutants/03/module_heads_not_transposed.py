"""Bug: the module splits heads with view(B, n_heads, L, head_dim) (a reinterpretation
of memory) instead of view(B, L, n_heads, head_dim).transpose(1, 2), so head h is not
columns [h*head_dim, (h+1)*head_dim) of q_proj's output.

Caught by: test_module_forward_matches_oracle_from_its_weights.
"""
SELECT = 'test_module_forward_matches_oracle_from_its_weights and d32-H4-Hkv2-full'
MESSAGE = 'head h is columns [h*head_dim, (h+1)*head_dim) of a projection'
MUTATE = [("        q = self.q_proj(x).view(B, L, self.n_heads, hd).transpose(1, 2)",
           "        q = self.q_proj(x).view(B, self.n_heads, L, hd)")]
