"""Bug: hands the non-causal case to torch's scaled_dot_product_attention(enable_gqa=True),
which the contract forbids.

Caught by: test_does_not_call_scaled_dot_product_attention.
"""
SELECT = 'test_does_not_call_scaled_dot_product_attention'
MESSAGE = 'called torch.nn.functional.scaled_dot_product_attention'
MUTATE = [
    ("    G = Hq // Hkv\n",
     "    G = Hq // Hkv\n"
     "    if not is_causal:\n"
     "        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)\n"),
]
