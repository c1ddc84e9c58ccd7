"""After a full acceptance the draft catches up on its last proposal by a separate call (gpt-fast's
extra draft forward) instead of merging it into the next block's first draft call (contract note 8).
Caught by: test_every_call_feeds_what_its_rolled_back_cache_lacks ("no separate catch-up call")."""
SELECT = 'test_every_call_feeds_what_its_rolled_back_cache_lacks'
MESSAGE = 'no separate catch-up call'
MUTATE = [('        d_cache.crop(min(d_cache.seq_len, N + n))\n', '        d_cache.crop(min(d_cache.seq_len, N + n))\n        if g and n == g and len(seq) < total:          # bug: a separate catch-up call\n            draft(torch.tensor([[props[-1]]], device=device), cache=d_cache)\n            stats.draft_calls += 1\n')]
