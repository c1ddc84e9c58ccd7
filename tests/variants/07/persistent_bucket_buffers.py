"""Correct, written another way (what torch's Reducer does): one flat buffer per bucket made
once at construction and reused every backward; a gradient is copied into its slot when its
hook fires, the full buffer is all-reduced in place, and the averaged slots are copied back.
No new buffer per step, the same launches in the same order: it must lose no point."""
MAY_FAIL = []
SELECT = ("matches_single_process or mixed_dtypes or one_collective or launched_during or no_sync "
          "or accumulated_gradient or unused_parameters")
MUTATE = [
    ("        self._sync = True\n        self._reset()\n",
     "        self._buffers = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)\n"
     "                         for b in self._params]\n"
     "        self._sync = True\n        self._reset()\n"),
    ("        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])\n",
     "        flat, offset = self._buffers[i], 0\n"
     "        for p in ps:\n"
     "            slot = flat[offset:offset + p.numel()]\n"
     "            slot.copy_(p.grad.reshape(-1)) if p.grad is not None else slot.zero_()\n"
     "            offset += p.numel()\n"),
]
