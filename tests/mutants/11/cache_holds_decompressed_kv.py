"""Bug: caching the decompressed K/V: besides the latent, the cache keeps per-head k_nope
and v, (B, max_seq_len, H, qk_nope + v), which the naive path writes and reads; nbytes
still reports the contract's formula, but the cache holds far more (the memory MLA exists
to save).

Caught by: test_nbytes_equals_formula_and_storage_is_preallocated ("storage not
preallocated to exactly nbytes ... (the latent plus decompressed per-head K/V)").
"""
SELECT = "test_nbytes_equals_formula_and_storage_is_preallocated and B3 and fp32"
MESSAGE = 'the latent plus decompressed per-head K/V'
MUTATE = [
    ("        self.device = self.latent.device\n",
     "        self.device = self.latent.device\n"
     "        self.kv = torch.zeros(batch_size, max_seq_len, cfg.n_heads, cfg.qk_nope_head_dim + cfg.v_head_dim,\n"
     "                              dtype=dtype, device=device)   # decompressed K/V, per head\n"),
    ("        return self.latent.numel() * self.latent.element_size()\n",
     "        return self.latent.numel() * self.latent.element_size()  # the formula; self.kv not counted\n"),
    ("            kv = self.wkv_b(c_all).view(B, Lk, H, dn + dv).to(wide)\n",
     "            kv = self.wkv_b(c_all).view(B, Lk, H, dn + dv)\n"
     "            if cache is not None:   # keep the expanded K/V of the new tokens in the cache, read all back\n"
     "                cache.kv[:, Lk - L:Lk] = kv[:, Lk - L:]\n"
     "                kv = cache.kv[:, :Lk]\n"
     "            kv = kv.to(wide)\n"),
]
