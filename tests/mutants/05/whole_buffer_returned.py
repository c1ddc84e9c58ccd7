"""Bug: update returns the whole per-layer buffer (max_seq_len slots) and attention
masks the slots past seq_len + T instead of never reading them: unwritten slots
(garbage, NaN) leak in as 0 * NaN.

Killed by: test_nan_prefilled_cache_gives_finite_identical_results,
test_update_returns_views_of_the_stored_prefix.
"""
SELECT = 'test_update_returns_views_of_the_stored_prefix'
MESSAGE = 'slots past seq_len were read'
MUTATE = [
    ("        return self.k[layer_idx, :, :, :S + T], self.v[layer_idx, :, :, :S + T]\n",
     "        return self.k[layer_idx], self.v[layer_idx]\n"),
    ("        j = torch.arange(S + T, device=x.device)[None, :]\n",
     "        j = torch.arange(k.shape[2], device=x.device)[None, :]\n"),
]
