"""Bug: k_proj and v_proj sized with n_heads instead of n_kv_heads (the MHA habit);
forward then keeps only the first n_kv_heads heads' columns.

Caught by: test_projection_shapes_follow_head_counts.
"""
SELECT = 'test_projection_shapes_follow_head_counts and d32-H4-Hkv2'
MESSAGE = "the projections do not have the contract's shapes"
MUTATE = [
    ("        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)\n"
     "        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)\n",
     "        self.k_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)\n"
     "        self.v_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)\n"),
    ("        k = self.k_proj(x).view(B, L, self.n_kv_heads, hd)",
     "        k = self.k_proj(x)[..., :self.n_kv_heads * hd].view(B, L, self.n_kv_heads, hd)"),
    ("        v = self.v_proj(x).view(B, L, self.n_kv_heads, hd)",
     "        v = self.v_proj(x)[..., :self.n_kv_heads * hd].view(B, L, self.n_kv_heads, hd)"),
]
