"""Lab 07: data parallelism from scratch (what DistributedDataParallel does under the hood).

You build the wrapper that makes W replicas of a model train as one (Li et al.,
"PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020,
sec. 3.2): the replicas start equal (a broadcast from rank 0), and every backward
averages the gradients over the ranks, in buckets whose all-reduce starts while
backward is still computing the earlier layers' gradients. It runs inside an
initialised process group (gloo on CPU, nccl on GPU). Must not use
``torch.nn.parallel.DistributedDataParallel``, ``torch.distributed.Reducer``,
``torch.distributed.algorithms``, ``torch.distributed._composable`` or
``torch.distributed.fsdp``.

Parts (see README.md)
  A  broadcast and averaged gradients    pytest labs/07 -k part_a
  B  buckets and overlap                 pytest labs/07 -k part_b
  C  no_sync and unused parameters       pytest labs/07 -k part_c
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn


# --- Part A: broadcast at construction, averaged gradients after backward ---
# --- Part B: buckets in reverse parameter order, one async all-reduce each, launched from hooks ---
# --- Part C: no_sync() accumulation and unused parameters ---

class DDP(nn.Module):
    """Data-parallel wrapper: ``forward`` is the module's; after ``loss.backward()`` every
    ``param.grad`` is the average over the ranks of ``group``.

    module: the replica; kept as ``self.module`` (same Parameter and buffer objects).
    bucket_cap_mb: the most gradient bytes per bucket, in MiB (``2**20`` bytes); 0 puts
    every parameter alone. group: the process group (None: the world).

    __init__:
      1. ValueError for a negative or NaN ``bucket_cap_mb`` (a number >= 0);
      2. overwrite every parameter and buffer in place with rank 0's
         (``dist.broadcast(t, group_src=0, group=group)``);
      3. ``self.buckets``: one pass over the parameters with ``requires_grad`` in REVERSE
         ``module.parameters()`` order; a parameter joins the current bucket unless its
         gradient bytes (``numel * element_size``) would take the bucket past
         ``bucket_cap_mb * 2**20``, or its dtype or device differs: then it opens a new
         bucket. A list (bucket 0 first) of lists of names from ``module.named_parameters()``;
      4. a ``register_post_accumulate_grad_hook`` on every such parameter.
    backward (your hooks): when bucket i is complete and buckets 0..i-1 are launched,
      launch bucket i: ONE ``dist.all_reduce(flat, group=group, async_op=True)`` of its
      gradients, flattened in its dtype (a None grad counts as zeros); never wait in a hook.
      The first hook of a backward queues a callback
      (``torch.autograd.Variable._execution_engine.queue_callback``) that runs when the
      backward ends: it launches the buckets still waiting (unused parameters), waits for
      every launch, divides by W and writes the averages into ``param.grad``.
    no_sync(): backward inside accumulates local gradients and communicates nothing.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, group=None):
        super().__init__()
        self.module = module
        raise NotImplementedError("Part A: validate bucket_cap_mb, broadcast parameters and buffers from rank 0; "
                                  "Part B: build self.buckets and register a post-accumulate-grad hook per parameter")

    def forward(self, *args, **kwargs):
        """The wrapped module's forward; communicates nothing."""
        raise NotImplementedError("Part A: return self.module(*args, **kwargs)")

    @contextlib.contextmanager
    def no_sync(self):
        """Part C: backward inside accumulates local gradients and communicates nothing; the
        next backward outside averages the accumulated sum."""
        raise NotImplementedError("Part C: turn the hooks off while inside, back on after")
        yield
