"""Correct, written another way: KVCache keeps its K/V tensors in a helper object
(``self._storage``, a small class holding them in a dict, with a back-reference to the
cache), not as its own attributes; ``k`` and ``v`` are read-only properties. The graders
must find the storage wherever the cache holds it (attributes, containers, helper objects,
at any depth, a cycle included) and grade it like the reference's: before issue 13 point 6
it lost 7 tests (held storage 0 bytes, update "returns copies") while the overflow,
NaN-prefill and no-reallocation checks read no storage at all and passed vacuously.
"""
MAY_FAIL = []
SELECT = "nbytes or views or overflow or wrong_shape or nan_prefilled or reallocated"
MUTATE = [
    ("        self.k = torch.empty(shape, dtype=dtype, device=device)\n"
     "        self.v = torch.empty(shape, dtype=dtype, device=device)\n",
     "        self._storage = _Storage(self, shape, dtype, device)\n"),
    ("    def reset(self) -> None:\n"
     "        \"\"\"Empty the cache (``seq_len = 0``); the storage is kept.\"\"\"\n"
     "        self.seq_len = 0\n",
     "    def reset(self) -> None:\n"
     "        \"\"\"Empty the cache (``seq_len = 0``); the storage is kept.\"\"\"\n"
     "        self.seq_len = 0\n"
     "\n"
     "    k = property(lambda self: self._storage.kv[\"k\"])\n"
     "    v = property(lambda self: self._storage.kv[\"v\"])\n"
     "\n"
     "\n"
     "class _Storage:\n"
     "    \"\"\"The K/V buffers of one KVCache, apart from its bookkeeping.\"\"\"\n"
     "\n"
     "    def __init__(self, owner, shape, dtype, device):\n"
     "        self.owner = owner  # a cycle: cache -> storage -> cache\n"
     "        self.kv = {\"k\": torch.empty(shape, dtype=dtype, device=device),\n"
     "                   \"v\": torch.empty(shape, dtype=dtype, device=device)}\n"),
]
