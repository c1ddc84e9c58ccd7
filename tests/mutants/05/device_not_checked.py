"""Bug: KVCache.update does not check the device of k and v; a tensor on another
device fails inside the copy with a RuntimeError/NotImplementedError instead of the
contract's ValueError.

Killed by: test_wrong_shape_or_device_raises_value_error[meta-device].
"""
SELECT = 'test_wrong_shape_or_device_raises_value_error and meta-device'
MESSAGE = 'on the meta device for a cpu cache'
MUTATE = [
    ("            if t.device != self.device:\n                raise ValueError(f\"{name} is on {t.device}, the cache on {self.device}\")\n"
     "            if t.dtype != self.dtype:\n                raise TypeError(f\"{name} has dtype {t.dtype}, the cache {self.dtype}\")\n"
     "        if k.shape != v.shape:\n            raise ValueError(f\"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}\")\n"
     "        S, T = self.seq_len, k.shape[2]\n",
     "            if t.dtype != self.dtype:\n                raise TypeError(f\"{name} has dtype {t.dtype}, the cache {self.dtype}\")\n"
     "        if k.shape != v.shape:\n            raise ValueError(f\"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}\")\n"
     "        S, T = self.seq_len, k.shape[2]\n"),
]
