"""Lab 01 written another way, correct (issue "Graders that charge one deviation once", item V):
blocking ``dist.send``/``dist.recv`` only, ordered by parity so that no two neighbours both
send first (even ranks send then receive, odd ranks receive then send; with W odd the two even
neighbours W-1 and 0 still resolve down the chain); ``ring_all_reduce`` splits the tensor its
own way, ``torch.tensor_split`` chunks whose sizes differ by at most one (each message at most
ceil(N/W) elements; with N < W some chunks are empty and both sides of such a pair skip it),
while ``ring_reduce_scatter`` and ``ring_all_gather`` use the contract's ceil(N/W) layout.
Slower (every step is serialised), never wrong: it must score the reference's marks."""
from __future__ import annotations

import torch
import torch.distributed as dist

OPS = ("sum", "avg", "max")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


def ring_neighbours(group=None) -> tuple[int, int, int, int]:
    """(rank, W, right, left): rank and W within ``group``, right/left as global ranks."""
    W = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if group is None:
        return rank, W, (rank + 1) % W, (rank - 1) % W
    return (rank, W, dist.get_global_rank(group, (rank + 1) % W),
            dist.get_global_rank(group, (rank - 1) % W))


def _check(tensor, op):
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in DTYPES:
        raise TypeError(f"tensor: expected a tensor of one of {DTYPES}, got {getattr(tensor, 'dtype', tensor)!r}")
    if op not in OPS:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    if op == "avg" and not tensor.is_floating_point():
        raise TypeError(f"op='avg' needs a floating dtype, got {tensor.dtype}")


def _send_recv(send, recv, group):
    """Send ``send`` right and receive ``recv`` from the left with blocking calls, even ranks
    first sending, odd ranks first receiving. Chunk sizes are the same on every rank, so an
    empty message is skipped by both of its ends."""
    rank, _, right, left = ring_neighbours(group)
    first_send = rank % 2 == 0
    for sending in (first_send, not first_send):
        if sending and send.numel():
            dist.send(send, right, group=group)
        elif not sending and recv.numel():
            dist.recv(recv, left, group=group)


def _ring(chunks, op, group):
    """Reduce-scatter over the list ``chunks`` (same sizes on every rank): afterwards
    ``chunks[rank]`` holds the reduction of chunk ``rank``; partial sums stay in the chunks."""
    rank, W, _, _ = ring_neighbours(group)
    for s in range(W - 1):
        dst = chunks[(rank - s - 2) % W]
        incoming = torch.empty_like(dst)
        _send_recv(chunks[(rank - s - 1) % W], incoming, group)
        if op == "max":
            dst.copy_(torch.maximum(dst, incoming))
        else:
            dst += incoming


def _gather(chunks, group):
    """All-gather over the list ``chunks``: ``chunks[rank]`` is final, fill the others."""
    rank, W, _, _ = ring_neighbours(group)
    for s in range(W - 1):
        _send_recv(chunks[(rank - s) % W], chunks[(rank - s - 1) % W], group)


def _wide(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def ring_reduce_scatter(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    _check(tensor, op)
    rank, W, _, _ = ring_neighbours(group)
    n = tensor.numel()
    c = -(-n // W)
    flat = torch.cat([tensor.reshape(-1).to(_wide(tensor.dtype)),
                      torch.zeros(W * c - n, dtype=_wide(tensor.dtype), device=tensor.device)])
    chunks = [flat[i * c:(i + 1) * c] for i in range(W)]
    _ring(chunks, op, group)
    result = chunks[rank] / W if op == "avg" else chunks[rank]
    return result.to(tensor.dtype).clone()


def ring_all_gather(chunk: torch.Tensor, numel: int, group=None) -> torch.Tensor:
    if not isinstance(chunk, torch.Tensor):
        raise TypeError(f"chunk must be a tensor, got {type(chunk).__name__}")
    if not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel={numel!r} must be an int >= 0")
    rank, W, _, _ = ring_neighbours(group)
    c = -(-numel // W)
    if chunk.numel() != c:
        raise ValueError(f"chunk of {chunk.numel()} elements, expected ceil({numel}/{W}) = {c}")
    flat = torch.empty(W * c, dtype=chunk.dtype, device=chunk.device)
    chunks = [flat[i * c:(i + 1) * c] for i in range(W)]
    chunks[rank].copy_(chunk.reshape(-1))
    _gather(chunks, group)
    return flat[:numel].clone()


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    _check(tensor, op)
    rank, W, _, _ = ring_neighbours(group)
    if W == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.reshape(-1).to(_wide(tensor.dtype), copy=True)
    chunks = list(torch.tensor_split(flat, W))  # sizes floor(N/W) or ceil(N/W): our own layout
    _ring(chunks, op, group)
    if op == "avg":
        chunks[rank] /= W
    final = [ch.to(tensor.dtype) for ch in chunks]  # rounded once, by the owner, before it travels
    _gather(final, group)
    tensor.copy_(torch.cat(final).view(tensor.shape))
    return tensor


# graded as a variant (tests/variants/README.md)
MAY_FAIL = []
SELECT = "not W4"  # CI time: every test but the W=4 cases (all of them pass: `labs grade` gives the reference's marks)
