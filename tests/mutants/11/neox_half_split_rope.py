"""Bug: RoPE pairs rotated half-split (NeoX / Llama-HF style: t[i] with t[i + dr/2])
instead of the contract's interleaved pairs (t[2i], t[2i+1]).

Caught by: test_naive_matches_float64_oracle ("RoPE pairs look rotated half-split (NeoX
style)").
"""
SELECT = "test_naive_matches_float64_oracle and odd-B2"
MESSAGE = 'RoPE pairs look rotated half-split (NeoX style'
MUTATE = [
    ("    x0, x1 = x[..., 0::2], x[..., 1::2]\n"
     "    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)\n",
     "    half = x.shape[-1] // 2\n"
     "    x0, x1 = x[..., :half], x[..., half:]\n"
     "    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)\n"),
]
