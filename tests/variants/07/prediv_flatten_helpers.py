"""Correct, written another way: each bucket is flattened with torch's
``_flatten_dense_tensors``, divided by W before the all-reduce (not after) and copied back with
``_unflatten_dense_tensors``. The sum of pre-divided gradients differs from the reference's
divided sum only in rounding (within the contract's float32 atol 1e-6), and nothing else
changes: it must lose no point (bucket order, overlap, the one collective per bucket)."""
MAY_FAIL = []
SELECT = ("matches_single_process or mixed_dtypes or one_collective or launched_during or no_sync "
          "or accumulated_gradient")
MUTATE = [
    ("        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])\n",
     "        from torch._utils import _flatten_dense_tensors\n"
     "        flat = _flatten_dense_tensors([p.grad if p.grad is not None else torch.zeros_like(p) for p in ps])\n"
     "        flat.div_(self.world_size)\n"),
    ("            work.wait()\n            flat /= self.world_size\n            offset = 0\n            for p in ps:\n"
     "                g = flat[offset:offset + p.numel()].view_as(p)\n                offset += p.numel()\n",
     "            work.wait()\n            from torch._utils import _unflatten_dense_tensors\n"
     "            for p, g in zip(ps, _unflatten_dense_tensors(flat, ps)):\n"),
]
