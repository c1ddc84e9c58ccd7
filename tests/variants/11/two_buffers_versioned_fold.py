"""Correct, written another way: the cache keeps the latent and the rope key in two
tensors, c_kv (B, S, r) and k_rope (B, S, dr), and the layer keeps its folded W_UK / W_UV
between calls (per head, not per token), refolded whenever wkv_b's version, storage or
dtype changes. Proves the bytes, contents, freshness and nothing-per-head-kept tests are
layout-free and allow a saved fold. It must lose nothing."""
MAY_FAIL = []
MUTATE = [
    ("            w = self.wkv_b.weight.to(wide).view(H, dn + dv, r)   # recomputed each call: never stale\n"
     "            w_uk, w_uv = w[:, :dn], w[:, dn:]                    # (H, dn, r), (H, dv, r)\n",
     "            wb = self.wkv_b.weight\n"
     "            key = (wb._version, wb.data_ptr(), wide)\n"
     "            if getattr(self, \"_fold_key\", None) != key:   # refold when wkv_b changes\n"
     "                w = wb.detach().to(wide).view(H, dn + dv, r)\n"
     "                self._fold = (w[:, :dn].contiguous(), w[:, dn:].contiguous())\n"
     "                self._fold_key = key\n"
     "            w_uk, w_uv = self._fold\n"),
    ("        self.latent = torch.zeros(batch_size, max_seq_len, cfg.kv_lora_rank + cfg.qk_rope_head_dim,\n"
     "                                  dtype=dtype, device=device)\n"
     "        self.device = self.latent.device\n",
     "        self.c_kv = torch.zeros(batch_size, max_seq_len, cfg.kv_lora_rank, dtype=dtype, device=device)\n"
     "        self.k_rope = torch.zeros(batch_size, max_seq_len, cfg.qk_rope_head_dim, dtype=dtype, device=device)\n"
     "        self.device = self.c_kv.device\n"),
    ("        return self.latent.numel() * self.latent.element_size()\n",
     "        return (self.c_kv.numel() + self.k_rope.numel()) * self.c_kv.element_size()\n"),
    ("        self.latent[:, S:S + L, :r] = c_kv\n"
     "        self.latent[:, S:S + L, r:] = k_rope\n"
     "        self.seq_len = S + L\n"
     "        return self.latent[:, :S + L, :r], self.latent[:, :S + L, r:]",
     "        self.c_kv[:, S:S + L] = c_kv\n"
     "        self.k_rope[:, S:S + L] = k_rope\n"
     "        self.seq_len = S + L\n"
     "        return self.c_kv[:, :S + L], self.k_rope[:, :S + L]"),
]
