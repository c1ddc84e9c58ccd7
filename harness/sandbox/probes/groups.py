"""Process groups of the multi-rank labs: the ranks join, leave and split them (never grader code)."""
from __future__ import annotations

import datetime

import torch

from . import common


# --- process groups (multi-rank labs; the ranks run these, never a grader's code) ---------------

def probe_init_pg(module, rank, world_size, backend, store_path, timeout_s):
    """Join a fresh process group through a ``FileStore`` in the sandbox's private /tmp."""
    import torch.distributed as dist
    store = dist.FileStore(store_path, world_size)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    dist.barrier(device_ids=[rank]) if backend == "nccl" else dist.barrier()
    common.note("process group ready")
    return None, {}


def probe_destroy_pg(module):
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return None, {}


def probe_new_groups(module, members):
    """``dist.new_group(m)`` for each member list, in order (every rank calls it);
    value: the groups this rank belongs to (None where it does not)."""
    import torch.distributed as dist
    rank = dist.get_rank()
    out = []
    for m in members:
        g = dist.new_group(list(m))
        out.append(g if rank in m else None)
    return out, {}


def probe_keep(module, value):
    """Keep ``value`` (e.g. a tensor that must stay in the worker between calls) and
    answer with a handle to it."""
    return value, {"keep": True}
