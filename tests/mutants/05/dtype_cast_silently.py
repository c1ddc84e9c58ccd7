"""Bug: KVCache.update accepts k/v of another dtype and silently casts them on write
(the contract asks for TypeError).

Killed by: test_wrong_dtype_raises_type_error.
"""
SELECT = 'test_wrong_dtype_raises_type_error'
MESSAGE = 'for a float16 cache: expected TypeError'
MUTATE = [
    ("            if t.dtype != self.dtype:\n                raise TypeError(f\"{name} has dtype {t.dtype}, the cache {self.dtype}\")\n"
     "        if k.shape != v.shape:\n            raise ValueError(f\"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}\")\n"
     "        S, T = self.seq_len, k.shape[2]\n",
     "        if k.shape != v.shape:\n            raise ValueError(f\"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}\")\n"
     "        S, T = self.seq_len, k.shape[2]\n"),
]
