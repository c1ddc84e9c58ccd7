"""Lab 01 written another way, correct (issue "Graders that charge one deviation once", item V):
every ring step is one ``dist.batch_isend_irecv`` of ``P2POp``s, the chunks are a Python list
of views (``unbind``) reduced through a table of out-of-place ops, and ``ring_all_reduce`` is
literally ``ring_reduce_scatter`` followed by ``ring_all_gather`` (the public functions: the
owner rounds its float32 chunk once, the all-gather then circulates the caller's dtype).
It must score the reference's marks."""
from __future__ import annotations

import torch
import torch.distributed as dist

OPS = ("sum", "avg", "max")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
REDUCE = {"sum": torch.add, "avg": torch.add, "max": torch.maximum}  # avg divides once, at the end


def ring_neighbours(group=None) -> tuple[int, int, int, int]:
    """(rank, W, right, left): rank and W within ``group``, right/left as global ranks."""
    W = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if group is None:
        return rank, W, (rank + 1) % W, (rank - 1) % W
    return (rank, W, dist.get_global_rank(group, (rank + 1) % W),
            dist.get_global_rank(group, (rank - 1) % W))


def _validate(tensor, op) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPES:
        raise TypeError(f"tensor: unsupported dtype {tensor.dtype}")
    if op not in OPS:
        raise ValueError(f"op={op!r}: expected one of {OPS}")
    if op == "avg" and not tensor.is_floating_point():
        raise TypeError(f"op='avg' on integer dtype {tensor.dtype}")


def _step(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group) -> None:
    ops = [dist.P2POp(dist.isend, send, right, group), dist.P2POp(dist.irecv, recv, left, group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def ring_reduce_scatter(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    _validate(tensor, op)
    rank, W, right, left = ring_neighbours(group)
    N = tensor.numel()
    c = -(-N // W)
    wide = torch.float32 if tensor.dtype in (torch.float16, torch.bfloat16) else tensor.dtype
    padded = torch.zeros(W * c, dtype=wide, device=tensor.device)
    padded[:N] = tensor.reshape(-1).to(wide)
    chunks = list(padded.view(W, c).unbind(0))  # chunks[i]: flat elements [i*c, (i+1)*c)
    if c:
        inbox = torch.empty(c, dtype=wide, device=tensor.device)
        for s in range(W - 1):  # pass chunk rank-1-s on, fold the one arriving into chunk rank-2-s
            _step(chunks[(rank - 1 - s) % W], inbox, right, left, group)
            target = chunks[(rank - 2 - s) % W]
            target.copy_(REDUCE[op](target, inbox))
    mine = chunks[rank] / W if op == "avg" else chunks[rank]
    return mine.to(tensor.dtype).clone()


def ring_all_gather(chunk: torch.Tensor, numel: int, group=None) -> torch.Tensor:
    if not isinstance(chunk, torch.Tensor):
        raise TypeError(f"chunk must be a torch.Tensor, got {type(chunk).__name__}")
    rank, W, right, left = ring_neighbours(group)
    if not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be an int >= 0, got {numel!r}")
    c = -(-numel // W)
    if chunk.numel() != c:
        raise ValueError(f"chunk has {chunk.numel()} elements; numel={numel} on W={W} ranks needs {c}")
    out = torch.empty(W * c, dtype=chunk.dtype, device=chunk.device)
    slots = list(out.view(W, c).unbind(0))
    slots[rank].copy_(chunk.reshape(-1))
    if c:
        for s in range(W - 1):  # pass on the chunk received last (first: our own)
            _step(slots[(rank - s) % W], slots[(rank - s - 1) % W], right, left, group)
    return out[:numel]


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    _validate(tensor, op)
    _, W, _, _ = ring_neighbours(group)
    if W == 1 or tensor.numel() == 0:
        return tensor
    mine = ring_reduce_scatter(tensor, op, group)  # reduced in float32 for fp16/bf16, rounded once
    tensor.copy_(ring_all_gather(mine, tensor.numel(), group).view(tensor.shape))
    return tensor


# graded as a variant (tests/variants/README.md)
MAY_FAIL = []
SELECT = "not W4"  # CI time: every test but the W=4 cases (all of them pass: `labs grade` gives the reference's marks)
