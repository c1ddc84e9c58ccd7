"""Bug: a rope key per head instead of one shared: the cache stores k_rope repeated for
every head, (B, S, r + H * qk_rope), so the cache is H times larger in its rope part
than the contract's B * S * (r + qk_rope) numbers (outputs stay right).

Caught by: test_nbytes_equals_formula_and_storage_is_preallocated ("nbytes is wrong ...
the rope key stored once per head").
"""
SELECT = "test_nbytes_equals_formula_and_storage_is_preallocated and B3 and fp32"
MESSAGE = 'the rope key stored once per head'
MUTATE = [
    ("self.latent = torch.zeros(batch_size, max_seq_len, cfg.kv_lora_rank + cfg.qk_rope_head_dim,",
     "self.latent = torch.zeros(batch_size, max_seq_len, cfg.kv_lora_rank + cfg.n_heads * cfg.qk_rope_head_dim,"),
    ("        self.latent[:, S:S + L, r:] = k_rope\n",
     "        self.latent[:, S:S + L, r:] = k_rope.repeat(1, 1, self.cfg.n_heads)  # one copy per head\n"),
    ("        return self.latent[:, :S + L, :r], self.latent[:, :S + L, r:]",
     "        return self.latent[:, :S + L, :r], self.latent[:, :S + L, r:r + self.cfg.qk_rope_head_dim]"),
]
