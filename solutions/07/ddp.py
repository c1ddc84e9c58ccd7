"""Lab 07 reference: data parallelism from scratch (what DistributedDataParallel does).

Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
VLDB 2020, sec. 3.2: broadcast at construction, gradient buckets in reverse parameter
order, one asynchronous all-reduce per bucket launched from the gradient hooks while
backward still runs, and an autograd-engine callback that waits and averages before
``backward()`` returns.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn


def _check_cap(bucket_cap_mb) -> float:
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)):
        raise ValueError(f"bucket_cap_mb must be a number of MiB >= 0, got {bucket_cap_mb!r}")
    if math.isnan(bucket_cap_mb) or bucket_cap_mb < 0:
        raise ValueError(f"bucket_cap_mb must be a number of MiB >= 0, got {bucket_cap_mb!r}")
    return float(bucket_cap_mb)


def make_buckets(named_params, cap_bytes: float) -> list[list[str]]:
    """The contract's partition: one pass in reverse order; a bucket closes when the next
    parameter would take its gradient bytes past ``cap_bytes`` or has another dtype or device."""
    buckets: list[list[str]] = []
    size, key = 0, None
    for name, p in reversed(list(named_params)):
        nbytes = p.numel() * p.element_size()
        if buckets and (p.dtype, p.device) == key and size + nbytes <= cap_bytes:
            buckets[-1].append(name)
            size += nbytes
        else:
            buckets.append([name])
            size, key = nbytes, (p.dtype, p.device)
    return buckets


class DDP(nn.Module):
    """Data-parallel wrapper: ``forward`` is the module's; after ``loss.backward()`` every
    gradient is the average over the ranks of ``group``.

    module: the replica (same on every rank after the broadcast from rank 0 of ``group``).
    bucket_cap_mb: the most gradient bytes per bucket, in MiB (``2**20`` bytes); 0 puts
    every parameter alone. group: the process group (None: the world).
    Raises ValueError for a negative or NaN ``bucket_cap_mb``.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, group=None):
        super().__init__()
        cap = _check_cap(bucket_cap_mb)
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, group_src=0, group=group)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.buckets = make_buckets(named, cap * 2**20)
        params = dict(named)
        self._params = [[params[n] for n in b] for b in self.buckets]
        self._bucket_of = {id(p): i for i, b in enumerate(self._params) for p in b}
        self._sync = True
        self._reset()
        for p in params.values():
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside accumulates local gradients and communicates nothing."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def _reset(self) -> None:
        self._pending = [len(b) for b in self._params]
        self._ready: set[int] = set()
        self._launched: list = []  # (work, flat buffer) per launched bucket, in index order
        self._queued = False

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync or id(p) in self._ready:
            return
        if not self._queued:  # the first hook of this backward: finish when the engine is done
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._queued = True
        self._ready.add(id(p))
        self._pending[self._bucket_of[id(p)]] -= 1
        while len(self._launched) < len(self._params) and self._pending[len(self._launched)] == 0:
            self._launch(len(self._launched))

    def _launch(self, i: int) -> None:
        ps = self._params[i]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])
        self._launched.append((dist.all_reduce(flat, group=self.group, async_op=True), flat))

    def _finish(self) -> None:
        while len(self._launched) < len(self._params):  # buckets with an unused parameter
            self._launch(len(self._launched))
        for (work, flat), ps in zip(self._launched, self._params):
            work.wait()
            flat /= self.world_size
            offset = 0
            for p in ps:
                g = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
        self._reset()
