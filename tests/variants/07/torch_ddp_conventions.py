"""Lab 07 written another way, correct (issue "Graders that charge one deviation once", item V),
with torch's own DDP conventions where the contract allows: the construction broadcast is
coalesced (one flat buffer per dtype and device, broadcast once and copied back in place, as
``DistributedDataParallel``'s ``_sync_module_states`` does), a ``_Bucket`` object per bucket
holds its parameters, countdown, buffer and pending ``Work``, every hook is a closure over its
bucket, a cursor keeps the launches in index order, each gradient is divided by W before the
all-reduce (filled slice by slice into a buffer from ``torch.empty``), and at W = 1 nothing is
communicated at all (the contract allows it). It must score the reference's marks."""
from __future__ import annotations

MAY_FAIL = []  # correct code: it may fail nothing

import contextlib
import math
import numbers

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


class _Bucket:
    """One bucket: its parameters (reverse module order), how many gradients are still to
    come in this backward, and, once launched, its flat buffer and ``Work``."""

    def __init__(self, named):
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.numel = sum(p.numel() for p in self.params)
        self.reset()

    def reset(self):
        self.left, self.seen, self.flat, self.work = len(self.params), set(), None, None


def _partition(named, cap_bytes):
    """Lists of (name, param): one reverse pass; a bucket closes on the cap, a dtype or a device."""
    out, size = [], 0
    for name, p in reversed(named):
        nbytes = p.numel() * p.element_size()
        last = out[-1][-1][1] if out else None
        if last is not None and (last.dtype, last.device) == (p.dtype, p.device) and size + nbytes <= cap_bytes:
            out[-1].append((name, p))
            size += nbytes
        else:
            out.append([(name, p)])
            size = nbytes
    return out


class DDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, group=None):
        super().__init__()
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, numbers.Real) \
                or math.isnan(bucket_cap_mb) or bucket_cap_mb < 0:
            raise ValueError(f"bucket_cap_mb must be a number of MiB >= 0, got {bucket_cap_mb!r}")
        self.module = module
        self.group = group
        self.world = dist.get_world_size(group)
        if self.world > 1:
            self._broadcast_coalesced(list(module.parameters()) + list(module.buffers()))
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._buckets = [_Bucket(b) for b in _partition(named, float(bucket_cap_mb) * 2**20)]
        self.buckets = [list(b.names) for b in self._buckets]
        self._enabled, self._next, self._queued = True, 0, False
        for b in self._buckets:
            for p in b.params:
                p.register_post_accumulate_grad_hook(self._hook_for(b))

    def _broadcast_coalesced(self, tensors):
        by_kind: dict = {}
        for t in tensors:  # module order: the same groups in the same order on every rank
            by_kind.setdefault((t.dtype, t.device), []).append(t)
        with torch.no_grad():
            for ts in by_kind.values():
                flat = _flatten_dense_tensors([t.detach() for t in ts])
                dist.broadcast(flat, group_src=0, group=self.group)
                for t, v in zip(ts, _unflatten_dense_tensors(flat, ts)):
                    t.copy_(v)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        before, self._enabled = self._enabled, False
        try:
            yield
        finally:
            self._enabled = before

    def _hook_for(self, bucket: _Bucket):
        def hook(p):
            if not self._enabled or id(p) in bucket.seen:
                return
            if not self._queued:
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
                self._queued = True
            bucket.seen.add(id(p))
            bucket.left -= 1
            while self._next < len(self._buckets) and self._buckets[self._next].left == 0:
                self._launch(self._buckets[self._next])
                self._next += 1
        return hook

    def _launch(self, b: _Bucket):
        flat = torch.empty(b.numel, dtype=b.params[0].dtype, device=b.params[0].device)
        offset = 0
        for p in b.params:
            part = flat[offset:offset + p.numel()]
            part.zero_() if p.grad is None else part.copy_(p.grad.reshape(-1))
            offset += p.numel()
        flat.div_(self.world)
        b.flat = flat
        if self.world > 1:
            b.work = dist.all_reduce(flat, group=self.group, async_op=True)

    def _end_of_backward(self):
        for b in self._buckets[self._next:]:  # buckets holding a parameter nobody here used
            self._launch(b)
        for b in self._buckets:
            if b.work is not None:
                b.work.wait()
            for p, g in zip(b.params, _unflatten_dense_tensors(b.flat, b.params)):
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
            b.reset()
        self._next, self._queued = 0, False
