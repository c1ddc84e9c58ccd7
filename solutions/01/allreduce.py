"""Ring all-reduce from point-to-point messages (reference solution of lab 01).

The bandwidth-optimal ring of Patarasuk & Yuan (2009), as NCCL runs it: a
reduce-scatter (W-1 steps: pass a chunk to the right, add the chunk arriving
from the left) followed by an all-gather (W-1 steps: pass the finished chunks
around). Each rank sends 2(W-1) chunks of ceil(N/W) elements, independent of W
for large N. Every step posts its send and its receive together (isend +
irecv), so neighbours never wait on each other's blocking send.

Shape legend: N elements in the flattened tensor, W ranks in the group,
c = ceil(N / W) elements per chunk; chunk i covers flat elements [i*c, (i+1)*c).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

OPS = ("sum", "avg", "max")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


def _check(tensor, op: str) -> None:
    """Validate arguments identically on every rank, before any message moves."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPES:
        raise TypeError(f"tensor: dtype {tensor.dtype} is not supported (use one of {[str(d) for d in DTYPES]})")
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if op == "avg" and not tensor.dtype.is_floating_point:
        raise TypeError(f"op='avg' needs a floating-point tensor, got dtype {tensor.dtype}")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Partial sums of float16/bfloat16 travel and accumulate in float32 (rounded once at the end)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def ring_neighbours(group=None) -> tuple[int, int, int, int]:
    """(rank, W, right, left) for ``group`` (default: the world).

    ``rank`` and ``W`` are taken within the group; ``right`` and ``left`` are the
    *global* ranks of the next and previous ranks on the ring, which is what
    ``dist.isend(tensor, dst)`` and ``dist.irecv(tensor, src)`` expect.
    """
    W = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if group is None:
        return rank, W, (rank + 1) % W, (rank - 1) % W
    return (rank, W, dist.get_global_rank(group, (rank + 1) % W),
            dist.get_global_rank(group, (rank - 1) % W))


def _exchange(send_buf: torch.Tensor, recv_buf: torch.Tensor, right: int, left: int, group) -> None:
    """Send to the right and receive from the left at the same time (no blocking send)."""
    reqs = [dist.isend(send_buf, right, group=group), dist.irecv(recv_buf, left, group=group)]
    for r in reqs:
        r.wait()


def _reduce(acc: torch.Tensor, incoming: torch.Tensor, op: str) -> None:
    if op == "max":  # NaN-propagating, as the contract's max (a < b ? b : a or torch.fmax drop it)
        torch.maximum(acc, incoming, out=acc)
    else:  # "sum" and "avg": divide once, after the ring
        acc.add_(incoming)


def _reduce_scatter_chunks(chunks: torch.Tensor, op: str, group) -> None:
    """In place on ``chunks`` (W, c): afterwards row ``rank`` holds the reduction of row ``rank``.

    Step s (0..W-2): send row (rank-s-1) mod W to the right, receive row (rank-s-2) mod W
    from the left and reduce it into ours. The row sent at step s+1 is the one just
    reduced, so after W-1 steps row ``rank`` has collected all W contributions.
    """
    rank, W, right, left = ring_neighbours(group)
    c = chunks.shape[1]
    if W == 1 or c == 0:
        return
    incoming = torch.empty(c, dtype=chunks.dtype, device=chunks.device)
    for s in range(W - 1):
        send_idx, recv_idx = (rank - s - 1) % W, (rank - s - 2) % W
        _exchange(chunks[send_idx], incoming, right, left, group)
        _reduce(chunks[recv_idx], incoming, op)


def _all_gather_chunks(chunks: torch.Tensor, group) -> None:
    """In place on ``chunks`` (W, c) whose row ``rank`` is final: fill every other row.

    Step s: send row (rank-s) mod W to the right, receive row (rank-s-1) mod W from the left.
    """
    rank, W, right, left = ring_neighbours(group)
    if W == 1 or chunks.shape[1] == 0:
        return
    for s in range(W - 1):
        send_idx, recv_idx = (rank - s) % W, (rank - s - 1) % W
        _exchange(chunks[send_idx], chunks[recv_idx], right, left, group)


def _padded_chunks(tensor: torch.Tensor, W: int, dtype: torch.dtype) -> torch.Tensor:
    """A new (W, c) buffer of ``dtype`` holding the flattened ``tensor``, zero-padded at the end."""
    N = tensor.numel()
    c = -(-N // W)  # ceil(N / W)
    buf = torch.zeros(W * c, dtype=dtype, device=tensor.device)
    buf[:N] = tensor.reshape(-1)  # reshape copies a strided view; copy_ converts the dtype
    return buf.view(W, c)


# --- Part A: ring reduce-scatter ---

def ring_reduce_scatter(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """Reduce ``tensor`` across the ranks of ``group`` and return this rank's chunk.

    tensor: any shape, N elements, a dtype of ``DTYPES``; not modified.
    Returns a new 1-D tensor of c = ceil(N/W) elements (``tensor.dtype``): chunk ``rank``
    (flat elements [rank*c, (rank+1)*c)) reduced with ``op``; entries past N are unspecified.
    Raises TypeError (dtype, avg on integers) and ValueError (unknown op).
    Each rank sends (W-1) messages of c elements.
    """
    _check(tensor, op)
    rank, W, _, _ = ring_neighbours(group)
    chunks = _padded_chunks(tensor, W, _acc_dtype(tensor.dtype))
    _reduce_scatter_chunks(chunks, op, group)
    mine = chunks[rank]
    if op == "avg":
        mine = mine / W
    return mine.to(tensor.dtype).clone()


# --- Part B: ring all-gather ---

def ring_all_gather(chunk: torch.Tensor, numel: int, group=None) -> torch.Tensor:
    """Concatenate every rank's ``chunk`` in rank order and truncate to ``numel`` elements.

    chunk: c = ceil(numel/W) elements (any shape, read flattened), any dtype.
    Returns a new 1-D tensor of ``numel`` elements, ``chunk.dtype``.
    Raises TypeError (not a tensor), ValueError (numel < 0, or a chunk of the wrong length).
    Each rank sends (W-1) messages of c elements.
    """
    if not isinstance(chunk, torch.Tensor):
        raise TypeError(f"chunk must be a torch.Tensor, got {type(chunk).__name__}")
    if not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be an int >= 0, got {numel!r}")
    rank, W, _, _ = ring_neighbours(group)
    c = -(-numel // W)
    if chunk.numel() != c:
        raise ValueError(f"chunk has {chunk.numel()} elements, expected ceil(numel / W) = "
                         f"ceil({numel} / {W}) = {c}")
    chunks = torch.empty(W, c, dtype=chunk.dtype, device=chunk.device)
    chunks[rank] = chunk.reshape(-1)
    _all_gather_chunks(chunks, group)
    return chunks.view(-1)[:numel]


# --- Part C: ring all-reduce ---

def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """In-place all-reduce of ``tensor`` across ``group``: reduce-scatter, then all-gather.

    tensor: any shape and layout (strided views too), N >= 0 elements, a dtype of ``DTYPES``.
    Writes the result into ``tensor`` (elements outside a view untouched) and returns it.
    op: "sum", "avg" (floating dtypes only) or "max" (propagates NaN like torch.maximum).
    float16/bfloat16 accumulate in
    float32 and round once, so every rank ends with bitwise identical values.
    Raises TypeError (dtype, avg on integers) and ValueError (unknown op).
    Each rank sends 2(W-1) messages of ceil(N/W) elements (at most 4 bytes each for fp16/bf16).
    """
    _check(tensor, op)
    rank, W, _, _ = ring_neighbours(group)
    if W == 1 or tensor.numel() == 0:
        return tensor  # sum, avg and max of one contribution are the contribution
    chunks = _padded_chunks(tensor, W, _acc_dtype(tensor.dtype))  # (W, c)
    _reduce_scatter_chunks(chunks, op, group)
    if op == "avg":
        chunks[rank] /= W
    # round once, then circulate in the caller's dtype: every rank receives the same bits
    out = chunks.to(tensor.dtype) if chunks.dtype != tensor.dtype else chunks
    _all_gather_chunks(out, group)
    tensor.copy_(out.view(-1)[: tensor.numel()].view(tensor.shape))
    return tensor
