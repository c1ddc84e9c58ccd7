"""Bug: the cache's dtype is not checked: x of another dtype goes on to the write into the
cache, which fails with whatever error the copy gives (a RuntimeError here; a write that
casts would round silently), where the contract raises TypeError (a float32 layer writing
into a float64 cache is a caller's mistake, not something to round away).

Caught by: test_mismatched_cache_is_refused_and_unchanged[dtype] ("a float64 cache for a
float32 x: expected TypeError, got RuntimeError").
"""
SELECT = "test_mismatched_cache_is_refused_and_unchanged and dtype"
MESSAGE = 'a float64 cache for a float32 x: expected TypeError'
MUTATE = [("        if x.dtype != self.dtype:\n", "        if False:\n")]
