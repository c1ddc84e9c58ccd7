"""The target's KV cache is never cropped after a rejection: the next block's call starts after the
rejected proposals' stale entries (the rollback vLLM and HF do after verification).
Caught by: test_every_call_feeds_what_its_rolled_back_cache_lacks ("KV cache not rolled back")."""
SELECT = 'test_every_call_feeds_what_its_rolled_back_cache_lacks'
MESSAGE = 'KV cache not rolled back'
MUTATE = [('        t_cache.crop(min(t_cache.seq_len, N + n))   # the emitted sequence minus its last token\n', '        pass                                        # bug: no rollback of the target cache\n')]
