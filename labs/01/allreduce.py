"""Lab 01: ring all-reduce from point-to-point messages.

You build the bandwidth-optimal ring all-reduce that NCCL and Horovod use
(Patarasuk & Yuan, 2009) out of torch.distributed's send/recv primitives only:
no collective (all_reduce, reduce_scatter, all_gather, broadcast, ...) may be
called. It runs inside an initialised process group (gloo on CPU, nccl on GPU).

Parts (see README.md)
  A  ring_reduce_scatter   pytest labs/01 -k reduce_scatter
  B  ring_all_gather       pytest labs/01 -k all_gather
  C  ring_all_reduce       pytest labs/01 -k all_reduce

Shape legend: N elements in the flattened tensor, W ranks in the group,
rank = this rank's index within the group, c = ceil(N / W) elements per chunk;
chunk i covers flat elements [i*c, (i+1)*c) (the last chunks may be short or empty).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

OPS = ("sum", "avg", "max")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


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


# --- Part A: ring reduce-scatter ---

def ring_reduce_scatter(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """Reduce ``tensor`` across the ranks of ``group`` and return this rank's chunk.

    tensor: any shape, N elements, a dtype of ``DTYPES``; not modified.
    op: "sum", "avg" (floating dtypes only) or "max" (NaN-propagating, like torch.maximum).
    Returns a new 1-D tensor of c = ceil(N/W) elements of ``tensor.dtype`` holding chunk
    ``rank`` (flat elements [rank*c, (rank+1)*c)) reduced over all ranks; entries past the
    end of the data (padding) are unspecified.
    Raises TypeError (unsupported dtype; "avg" on an integer dtype) and ValueError
    (unknown op), on every rank, before any message moves.

    Ring (W-1 steps): at step s send chunk (rank-s-1) mod W to the right neighbour and
    receive chunk (rank-s-2) mod W from the left one, reducing it into yours. Post the
    send and the receive together (dist.isend + dist.irecv, then wait both): two
    neighbours that both start with a blocking dist.send wait for each other forever.
    float16/bfloat16 partial sums accumulate (and travel) in float32.
    Bandwidth: each rank sends (W-1) messages of c elements.
    """
    raise NotImplementedError("Part A: implement the ring reduce-scatter with isend/irecv "
                              "(W-1 steps of one chunk each)")


# --- Part B: ring all-gather ---

def ring_all_gather(chunk: torch.Tensor, numel: int, group=None) -> torch.Tensor:
    """Concatenate every rank's ``chunk`` in rank order, truncated to ``numel`` elements.

    chunk: this rank's chunk, c = ceil(numel / W) elements, any dtype.
    Returns a new 1-D tensor of ``numel`` elements, ``chunk.dtype``.
    Raises ValueError for a chunk whose length is not ceil(numel / W).

    Ring (W-1 steps): at step s send chunk (rank-s) mod W to the right and receive chunk
    (rank-s-1) mod W from the left. Each rank sends (W-1) messages of c elements.
    """
    raise NotImplementedError("Part B: implement the ring all-gather with isend/irecv "
                              "(W-1 steps of one chunk each)")


# --- Part C: ring all-reduce ---

def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """In-place all-reduce of ``tensor`` across ``group``: a reduce-scatter, then an all-gather.

    tensor: any shape and layout (contiguous, transposed or a strided view), any N >= 0
    (N < W too), a dtype of ``DTYPES``. The result is written into ``tensor`` (elements of
    the underlying storage outside the view stay untouched) and ``tensor`` is returned.
    op: "sum", "avg" (sum / W; floating dtypes only) or "max" (propagates NaN like
    torch.maximum: an element that is NaN on any rank is NaN on every rank).
    Every rank ends with bitwise identical values. float16/bfloat16 accumulate in float32
    and round once at the end.
    Raises TypeError (unsupported dtype; "avg" on an integer dtype) and ValueError (unknown op).
    Bandwidth: each rank sends at most 2(W-1) ceil(N/W) elements (of max(itemsize, 4) bytes).
    """
    raise NotImplementedError("Part C: reduce-scatter into chunks, then all-gather them, and write "
                              "the result into the caller's tensor (tensor.copy_)")
