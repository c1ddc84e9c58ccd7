"""Lab 15: fully sharded data parallelism (ZeRO-3 / FSDP) from scratch.

Every rank keeps only 1/W of every parameter, of its gradient and of the optimizer state;
a unit's full parameters exist only while that unit computes (Rajbhandari et al., "ZeRO",
SC 2020, stage 3; Zhao et al., "PyTorch FSDP", VLDB 2023, sec. 3). It runs inside an
initialised process group (gloo on CPU, nccl on GPU). Must not use
``torch.distributed.fsdp``, ``torch.distributed._composable``, ``torch.distributed.tensor``
(DTensor), ``torch.distributed._shard``, ``torch.distributed.algorithms`` or
``torch.nn.parallel.DistributedDataParallel``.

Parts (see README.md)
  A  sharding, forward, backward     pytest labs/15 -k part_a
  B  communication and memory        pytest labs/15 -k part_b
  C  prefetching                     pytest labs/15 -k part_c
"""
from __future__ import annotations

import math  # noqa: F401  (c = ceil(N / W))

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401
from torch import nn


# --- Part A: ownership, flat layout, shards, construction broadcast, forward, averaged gradients ---
# --- Part B: all-gather into one padded flat buffer, free after forward, reduce-scatter per unit ---
# --- Part C: prefetch the next unit's all-gather (forward order; reverse order in backward) ---

class FSDP(nn.Module):
    """Fully sharded data parallel wrapper (ZeRO-3).

    module: the ``nn.Module`` to shard (else ``TypeError`` naming ``module``); kept as
    ``self.module`` (the same object). units: a list or tuple of ``nn.Module`` (else
    ``TypeError`` naming ``units``), each a proper submodule of ``module``, pairwise distinct,
    not nested (else ``ValueError`` naming ``units``); ``[]``: one unit, the root. The root
    (``module`` itself, index ``len(units)``, last) owns every parameter not registered only
    inside one unit (parameters outside all units; parameters tied across units). group: the
    process group (None: the world); W = ``dist.get_world_size(group)``, r = ``dist.get_rank(group)``.
    prefetch: a bool (else ``TypeError``). Every parameter has one floating dtype and one
    device (else ``TypeError`` naming the dtypes).

    Construction: broadcast every parameter and buffer in place from group rank 0
    (``dist.broadcast(t, group_src=0, group=group)``); per unit, its trainable parameters (in
    ``units[i].named_parameters()`` order; the root: ``module.named_parameters()``, each tied
    parameter once) concatenated as ``p.reshape(-1)`` into N elements, zero-padded to W*c,
    c = ceil(N / W): rank r's shard is elements ``[r*c, (r+1)*c)``, an ``nn.Parameter`` of
    shape ``(c,)`` with its own storage; frozen parameters form a second flat by the same rule
    (``requires_grad=False``). ``self.parameters()`` yields exactly the shards: units in list
    order, the root last, trainable before frozen. Every original parameter is deleted from
    every module it is registered on (``del m._parameters[name]``).

    forward(*args, **kwargs): ``self.module(*args, **kwargs)`` with the full parameters: a
    unit is all-gathered (``dist.all_gather_single`` straight into one padded flat buffer)
    just before its forward and freed right after (``buffer.untyped_storage().resize_(0)``),
    gathered again before its backward, freed once its gradient is reduce-scattered
    (``dist.reduce_scatter_single``, SUM, then divide by W; added to ``shard.grad``). Create
    the views of the flat buffer at each forward (views made once run their backward last).
    Keep an attribute of each parameter's name on its module (views into the freed buffer,
    FSDP1-style): code around a unit may read ``unit.weight.dtype`` before calling it.
    Under ``torch.no_grad()`` every buffer is freed before forward returns.
    """

    def __init__(self, module, units, group=None, prefetch=False):
        super().__init__()
        raise NotImplementedError("Part A: validate, broadcast from group rank 0, build the flats, cut the shards, "
                                  "delete the original parameters, register the unit hooks")

    def forward(self, *args, **kwargs):
        """Gather the root, run the module (the units' hooks gather and free them), free everything
        under no_grad; otherwise leave the root for the end of backward."""
        raise NotImplementedError("Part A: return self.module(*args, **kwargs) computed with the full parameters")

    def full_state_dict(self) -> dict:
        """A collective: ``{name: full tensor}`` for ``module.named_parameters()`` at construction
        (each tied parameter once, under its first name), then ``module.named_buffers()``; new
        tensors of the full shape and dtype, sharing no storage with the wrapper."""
        raise NotImplementedError("Part A: all-gather every flat, cut it into the named parameters, add the buffers")
