"""Lab 17: collectives beyond the ring, and a hung collective.

What you build
  Part A  ``hd_all_reduce`` (Rabenseifner's recursive halving-doubling, MPICH's fold for W not a
          power of two), ``tree_broadcast`` and ``tree_reduce`` (binomial trees).
  Part B  ``make_hierarchy`` and ``hierarchical_all_reduce`` (intra-node reduce-scatter, inter-node
          all-reduce, intra-node all-gather), and the alpha-beta model ``allreduce_time`` /
          ``choose_allreduce``.
  Part C  ``FlightRecorder`` (a record of every collective call, dumped per rank) and ``diagnose``
          (who hung the job, on which group, at which sequence number).

Parts A and B run inside an initialised torch.distributed process group and move data with
point-to-point ops only (send, recv, isend, irecv, batch_isend_irecv); every collective raises
while they are graded. Part C's diagnose and the cost model are plain functions.

Test as you go: ``pytest labs/17`` (visible tests), ``-k hd`` / ``-k tree`` (Part A),
``-k "hier or cost"`` (Part B), ``-k "recorder or diagnose"`` (Part C);
``labs grade . --lab 17`` (self-grade with the hidden graders, where installed).

Given (finished; the graders use them as they are): ``Hierarchy`` (the record make_hierarchy
returns) and ``run_collectives`` (runs the graders' collective programs under your recorder).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from collections import Counter

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
OPS = ("sum", "avg", "max")
ALGORITHMS = ("ring", "halving_doubling", "hierarchical")
RECORDED_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                "reduce_scatter_tensor", "barrier")
STATES = ("scheduled", "started", "completed")
TRACE_VERSION = "lab17-1"


# --- Part A: latency-optimal algorithms ---------------------------------------------------------

def hd_all_reduce(tensor, op="sum", group=None):
    """In-place all-reduce by recursive halving (reduce-scatter), then recursive doubling (all-gather):
    Rabenseifner's algorithm (Thakur, Rabenseifner & Gropp 2005, section 4.2).

    tensor: any shape, contiguous or a strided view, N = tensor.numel() >= 0 elements, dtype in DTYPES.
    op: "sum", "avg" or "max". group: a ProcessGroup (None: the world); W = dist.get_world_size(group).
    Returns ``tensor`` itself, holding the reduction over the group's ranks on every rank (bitwise
    identical on every rank; storage outside the view untouched).

    W not a power of two: with p = 2^floor(log2 W), r = W - p, for i < r rank 2i sends its whole vector
    to rank 2i+1 and sits out; the p survivors (renumbered: partners are computed on that numbering)
    run the power-of-two algorithm; at the end rank 2i+1 sends the whole result back to rank 2i.
    Cost per rank: at most 2 log2 p (+1 if W != p) messages and 2 (p-1) ceil(N/p) (+N if W != p)
    elements, each of at most max(itemsize, 4) bytes. W = 1 or N = 0 sends nothing.
    float16/bfloat16 accumulate (and may travel) in float32 and are rounded once; "avg" divides the sum
    by W exactly once. Only send/recv/isend/irecv/batch_isend_irecv: post isend and irecv together
    (two blocking sends to each other deadlock under gloo).

    Raises (on every rank, before any message): TypeError for a dtype outside DTYPES (naming it) or
    "avg" on an integer dtype; ValueError for an unknown op (naming it).
    """
    raise NotImplementedError("Part A: hd_all_reduce")


def tree_broadcast(tensor, src=0, group=None):
    """Binomial-tree broadcast from group rank ``src``, in place.

    Afterwards every rank's ``tensor`` equals src's bitwise (src's is not modified). Every rank but src
    receives exactly one message (the N elements), src none; a rank sends at most ceil(log2 W)
    messages and the tree is at most ceil(log2 W) hops high (MPICH: relative rank v = (rank - src) mod W,
    parent v - lowbit(v)). ``src`` is a rank *within* ``group``. Returns ``tensor``.

    Raises: TypeError if ``src`` is not an int; ValueError if it is outside [0, W) (naming it).
    """
    raise NotImplementedError("Part A: tree_broadcast")


def tree_reduce(tensor, dst=0, op="sum", group=None):
    """Binomial-tree reduce to group rank ``dst``.

    Afterwards rank dst's ``tensor`` holds the reduction (ops, dtypes and rounding as hd_all_reduce);
    every other rank's ``tensor`` is unchanged, bitwise (partial results live in a scratch buffer:
    gloo's own reduce leaves them in the tensor, pytorch/pytorch #76527). Every rank but dst sends
    exactly one message (N elements; float32 for float16/bfloat16 is allowed), dst none; a rank
    receives at most ceil(log2 W) messages; the tree is at most ceil(log2 W) hops high. Returns ``tensor``.

    Raises: as hd_all_reduce for dtype and op; TypeError / ValueError for ``dst`` as tree_broadcast.
    """
    raise NotImplementedError("Part A: tree_reduce")


# --- Part B: two levels --------------------------------------------------------------------------

@dataclasses.dataclass
class Hierarchy:
    """Two levels over ``ranks`` (global, ascending): hierarchy rank i is ranks[i], on node i // L
    as local rank i % L. ``intra_group``: ranks[node*L:(node+1)*L]; ``inter_group``:
    ranks[local_rank::L] (one rank per node, same local rank)."""

    ranks: tuple
    local_size: int
    num_nodes: int
    rank: int
    node: int
    local_rank: int
    intra_group: object
    inter_group: object


def make_hierarchy(local_size, ranks=None):
    """The two-level groups over ``ranks`` (global ranks, ascending; None: the world).

    Collective over the *world*: every rank calls it with the same arguments, in the same order;
    ranks outside ``ranks`` get None. With L = local_size and n = len(ranks) / L nodes of consecutive
    ranks, returns a ``Hierarchy`` whose ``intra_group`` is ``ranks[node*L:(node+1)*L]`` and whose
    ``inter_group`` is ``ranks[local_rank::L]``. Create every group on every rank with plain
    ``dist.new_group(members)`` (not use_local_synchronization=True: pytorch/pytorch PR #189073).

    Raises (on every rank, before any group is made): TypeError if local_size is not an int;
    ValueError if it is < 1 or does not divide len(ranks) (naming it), or if ranks are not distinct
    ascending global ranks.
    """
    raise NotImplementedError("Part B: make_hierarchy")


def hierarchical_all_reduce(tensor, hierarchy, op="sum"):
    """Two-level all-reduce in place: reduce-scatter inside the node (chunk local_rank of
    ceil(N/L) elements), all-reduce of that chunk among ``inter_group``, all-gather inside the node.

    Called by the members of ``hierarchy`` only. Same ops, dtypes, rounding, views and identical bits
    as hd_all_reduce, with W = len(hierarchy.ranks). Per rank: elements sent to other nodes
    <= 2 (n-1) ceil(ceil(N/L)/n); elements in all <= 2 (L-1) ceil(N/L) + 2 (n-1) ceil(ceil(N/L)/n);
    bytes <= elements * max(itemsize, 4). Returns ``tensor``. Raises as hd_all_reduce.
    """
    raise NotImplementedError("Part B: hierarchical_all_reduce")


def allreduce_time(algorithm, n_bytes, world_size, local_size, alpha_intra, beta_intra, alpha_inter,
                   beta_inter):
    """Seconds one all-reduce of ``n_bytes`` takes under the alpha-beta model (alpha: s per
    message, beta: s per byte), P = world_size ranks, L = local_size per node, m = P/L nodes.

    ring: 2 (P-1) (alpha + n/P beta) on the intra link if m == 1, else the inter link.
    halving_doubling: sum over rounds j < log2 q of 2 (alpha_c + n/2^(j+1) beta_c), round j intra iff
      m == 1 or (r == 0 and L % 2^(j+1) == 0); plus, if r = P - q > 0, 2 (alpha_f + n beta_f), the fold
      intra iff m == 1 or L even (q = 2^floor(log2 P)).
    hierarchical: 2 (L-1) (alpha_intra + n/L beta_intra) + 2 (m-1) (alpha_inter + n/P beta_inter).
    P == 1 gives 0.0.

    Raises: ValueError for an unknown algorithm (naming it); TypeError if world_size/local_size are
    not ints; ValueError if < 1 or local_size does not divide world_size (naming it), or if n_bytes,
    an alpha or a beta is negative, NaN or infinite.
    """
    raise NotImplementedError("Part B: allreduce_time")


def choose_allreduce(n_bytes, world_size, local_size, alpha_intra, beta_intra, alpha_inter, beta_inter):
    """The name in ALGORITHMS with the smallest allreduce_time; a time within a relative 1e-9
    of the smallest counts as smallest and ties go to the earlier name (L == 1 gives "ring"; P == 1
    gives "ring"). Raises as allreduce_time.
    """
    raise NotImplementedError("Part B: choose_allreduce")


# --- Part C: diagnosing a hung collective ---------------------------------------------------------


class FlightRecorder:
    """Record every collective of RECORDED_OPS this rank enters, and dump the trace on exit.

    A context manager. While active, each call of ``torch.distributed.<name>`` (name in RECORDED_OPS,
    looked up on the module at call time; positional or keyword arguments) on a group this rank
    belongs to appends one entry before the call runs: record_id, pg_name (group_name; "0" for the
    world), pg_ranks (ascending global ranks), collective_seq_id (1, 2, ... per pg_name), op,
    input_sizes/output_sizes (lists of shapes), input_dtypes/output_dtypes (names such as "float32"),
    state ("started", then "completed" when the call returns; a call that raises stays "started").
    The call itself is unchanged. On exit (normal or by an exception, which propagates) the original
    functions are restored and {"version": TRACE_VERSION, "rank": r, "world_size": W, "entries": [...]}
    is written as JSON to <dump_dir>/rank<r>.json (the directory created if needed).
    ``trace()`` returns that dict.
    """

    def __init__(self, dump_dir):
        raise NotImplementedError("Part C: FlightRecorder.__init__")

    def __enter__(self):
        raise NotImplementedError("Part C: FlightRecorder.__enter__ (wrap the RECORDED_OPS functions)")

    def __exit__(self, *exc):
        raise NotImplementedError("Part C: FlightRecorder.__exit__ (restore, dump <dump_dir>/rank<r>.json)")

    def trace(self):
        raise NotImplementedError("Part C: FlightRecorder.trace")


def diagnose(traces):
    """Findings and culprits of a hung job from its ranks' traces (one per rank 0..W-1, any order).

    1. A group's members are the pg_ranks of its entries. A rank "waits" if any entry is not "completed".
    2. Per group, in string order of pg_name, walk seq k = 1, 2, ... up to the largest recorded on it;
       the first k where members disagree gives one finding {"pg", "seq", "kind", "ranks"} and ends the
       walk: "missing" (members with no entry (pg_name, k)), else "op_mismatch", "size_mismatch"
       ((input_sizes, output_sizes)), "dtype_mismatch" ((input_dtypes, output_dtypes)): ranks = members
       whose value differs from the value most members hold (ties: the value of the lowest rank).
       Match entries by (pg_name, seq), never by record_id.
    3. Culprits: ranks named by op/size/dtype findings and "missing" ranks that do not wait; if that
       is nobody but there is a "missing" finding (a cycle), every rank named by "missing" findings.
    Returns {"findings": [... in pg_name order], "culprits": [ascending ranks]}, JSON-able. Does not
    modify ``traces``.

    Raises ValueError for: no traces, a rank twice or missing, different world sizes, a group whose
    members differ, a rank recording on a group that excludes it, a state outside STATES, two entries
    with one (pg_name, seq) on a rank, an entry lacking a key ``diagnose`` reads.
    """
    raise NotImplementedError("Part C: diagnose")


# --- given: the graders' collective programs (finished; do not change) -----------------------------

def run_collectives(groups, steps, dump_dir, timeout_s=2.0):
    """Run one rank's part of a scripted collective program under ``FlightRecorder(dump_dir)``.

    ``groups``: member lists (global ranks); every rank creates each with ``dist.new_group(members,
    timeout=timeout_s)``, in order. ``steps``: this rank's calls, in order, each a dict ``{"op": one of
    RECORDED_OPS, "group": index into groups, "shape": list of ints, "dtype": name}``;
    each tensor holds ``global rank + 1``. A call that raises (a timeout) ends the program. Returns ``{"names": the
    groups' group_name (None where not a member), "results": the completed calls' output tensors,
    "error": the exception's text or None, "trace": the recorder's trace(), "dump": the JSON file it
    wrote, read back (None if missing), "restored": whether every torch.distributed.<name> of
    RECORDED_OPS is the original object again}``.
    """
    before = {name: getattr(dist, name) for name in RECORDED_OPS}
    made = [dist.new_group(list(m), timeout=datetime.timedelta(seconds=timeout_s)) for m in groups]
    me = dist.get_rank()
    names = [g.group_name if me in m else None for g, m in zip(made, groups)]
    results, error = [], None
    rec = FlightRecorder(dump_dir)
    try:
        with rec:
            for s in steps:
                g, size = made[s["group"]], len(groups[s["group"]])
                x = torch.full(tuple(s["shape"]), float(me + 1), dtype=getattr(torch, s["dtype"]))
                op = s["op"]
                if op in ("all_reduce", "broadcast", "reduce"):
                    extra = {"group_src": 0} if op == "broadcast" else {"group_dst": 0} if op == "reduce" else {}
                    getattr(dist, op)(x, group=g, **extra)
                    results.append(x)
                elif op == "all_gather":
                    out = [torch.empty_like(x) for _ in range(size)]
                    dist.all_gather(out, x, group=g)
                    results.append(torch.stack(out))
                elif op == "all_gather_into_tensor":
                    out = x.new_empty(size * x.shape[0], *x.shape[1:])
                    dist.all_gather_into_tensor(out, x, group=g)
                    results.append(out)
                elif op == "reduce_scatter_tensor":
                    out = x.new_empty(x.shape[0] // size, *x.shape[1:])
                    dist.reduce_scatter_tensor(out, x, group=g)
                    results.append(out)
                else:
                    dist.barrier(group=g)
                    results.append(torch.zeros(0))
    except Exception as e:  # noqa: BLE001 - a timed-out collective ends the program
        error = f"{type(e).__name__}: {e}"[:500]
    path = os.path.join(str(dump_dir), f"rank{me}.json")
    dump = None
    if os.path.exists(path):
        with open(path) as f:
            dump = json.load(f)
    restored = all(getattr(dist, name) is before[name] for name in RECORDED_OPS)
    return {"names": names, "results": results, "error": error, "trace": rec.trace(), "dump": dump,
            "restored": restored}
