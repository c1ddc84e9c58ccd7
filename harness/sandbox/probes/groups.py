"""Process groups of the multi-rank labs: the ranks join, leave and split them (never grader code)."""
from __future__ import annotations

import datetime

import torch

from . import common


# --- process groups (multi-rank labs; the ranks run these, never a grader's code) ---------------

_STORE: list = []  # the run's TCPStore on the rank that serves it (rank 0), kept until the group is destroyed


def probe_store(module, world_size, timeout_s):
    """Serve a fresh ``TCPStore`` for one run's process group on this rank (rank 0), on the
    private loopback; value: its port. The ranks share no file system: they meet only here,
    through the harness, and over the measured loopback."""
    import torch.distributed as dist
    _STORE[:] = [dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=timeout_s))]
    return int(_STORE[0].port), {}


def probe_init_pg(module, rank, world_size, backend, port, timeout_s):
    """Join a fresh process group through the run's ``TCPStore`` (:func:`probe_store`)."""
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _STORE[0] if rank == 0 and _STORE else dist.TCPStore("127.0.0.1", int(port), world_size,
                                                                 is_master=False, timeout=timeout)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    dist.barrier(device_ids=[rank]) if backend == "nccl" else dist.barrier()
    common.note("process group ready")
    return None, {}


def probe_destroy_pg(module):
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    _STORE.clear()
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
