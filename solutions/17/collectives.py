"""Lab 17 reference: collectives beyond the ring, and a hung collective.

Part A: Rabenseifner's all-reduce (recursive halving, then recursive doubling; MPICH's fold for
W not a power of two) and binomial-tree broadcast / reduce (Thakur, Rabenseifner & Gropp 2005).
Part B: a two-level (intra-node, inter-node, intra-node) all-reduce over sub-groups, and an
alpha-beta model that picks the algorithm. Part C: a flight recorder of collective calls and a
diagnosis of hung collectives, after PyTorch's NCCL Flight Recorder and its analyzer.
Only point-to-point ops move data in Parts A and B.
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


# --- helpers (shared by Parts A and B) ---------------------------------------------------------

def _check(tensor, op):
    """The contract's argument errors, raised on every rank before any message."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPES:
        raise TypeError(f"unsupported dtype {tensor.dtype}; supported: {DTYPES}")
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    if op == "avg" and not tensor.dtype.is_floating_point:
        raise TypeError(f"op='avg' is not defined for the integer dtype {tensor.dtype}")


def _acc_dtype(dtype):
    """float16/bfloat16 partial results accumulate (and travel) in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _combine(acc, incoming, op):
    if op == "max":
        torch.maximum(acc, incoming, out=acc)
    else:
        acc.add_(incoming)


def _finish(tensor, flat, op, count):
    """Write the reduction ``flat`` (accumulation dtype) through the caller's view, rounded once."""
    if op == "avg":
        flat = flat / count
    tensor.copy_(flat.view(tensor.shape).to(tensor.dtype))
    return tensor


def _peer(group, i):
    """Global rank of group rank ``i`` (isend/irecv take global peers)."""
    return i if group is None else dist.get_global_rank(group, i)


def _exchange(group, peer, send_buf, recv_buf):
    """Send and receive together with one partner (two blocking sends would deadlock)."""
    reqs = [dist.isend(send_buf, _peer(group, peer), group=group),
            dist.irecv(recv_buf, _peer(group, peer), group=group)]
    for r in reqs:
        r.wait()


def _check_root(root, W, name):
    if isinstance(root, bool) or not isinstance(root, int):
        raise TypeError(f"{name} must be an int (a rank of the group), got {type(root).__name__}")
    if not 0 <= root < W:
        raise ValueError(f"{name}={root} is outside the group's ranks [0, {W})")


# --- Part A: latency-optimal algorithms ---------------------------------------------------------

def hd_all_reduce(tensor, op="sum", group=None):
    """Rabenseifner's all-reduce in place (see the stub for the contract)."""
    _check(tensor, op)
    rank, W = dist.get_rank(group), dist.get_world_size(group)
    N = tensor.numel()
    if W == 1 or N == 0:
        return _finish(tensor, tensor.reshape(-1).to(_acc_dtype(tensor.dtype)), op, 1)
    buf = tensor.reshape(-1).to(_acc_dtype(tensor.dtype), copy=True)
    p = 1 << (W.bit_length() - 1)
    r = W - p
    # fold: for i < r, rank 2i hands its whole vector to 2i+1 and sits out
    if rank < 2 * r:
        if rank % 2 == 0:
            dist.send(buf, _peer(group, rank + 1), group=group)
            dist.recv(buf, _peer(group, rank + 1), group=group)
            return _finish(tensor, buf, op, W)
        tmp = torch.empty_like(buf)
        dist.recv(tmp, _peer(group, rank - 1), group=group)
        _combine(buf, tmp, op)
        newrank = rank // 2
    else:
        newrank = rank - r

    def real(nr):  # the group rank of survivor ``nr``
        return 2 * nr + 1 if nr < r else nr + r

    cnts = [N // p + (i < N % p) for i in range(p)]
    displs = [sum(cnts[:i]) for i in range(p + 1)]
    lo, hi = 0, p  # the blocks this rank is still responsible for
    steps = []
    mask = 1
    while mask < p:  # recursive halving (reduce-scatter), distance 1 first
        partner = real(newrank ^ mask)
        half = (hi - lo) // 2
        if newrank & mask == 0:
            keep, give = (lo, lo + half), (lo + half, hi)
        else:
            keep, give = (lo + half, hi), (lo, lo + half)
        ks, ke = displs[keep[0]], displs[keep[1]]
        gs, ge = displs[give[0]], displs[give[1]]
        tmp = torch.empty(ke - ks, dtype=buf.dtype)
        _exchange(group, partner, buf[gs:ge].clone(), tmp)
        _combine(buf[ks:ke], tmp, op)
        steps.append((partner, keep, give))
        lo, hi = keep
        mask <<= 1
    for partner, keep, give in reversed(steps):  # recursive doubling (all-gather)
        ks, ke = displs[keep[0]], displs[keep[1]]
        gs, ge = displs[give[0]], displs[give[1]]
        tmp = torch.empty(ge - gs, dtype=buf.dtype)
        _exchange(group, partner, buf[ks:ke].clone(), tmp)
        buf[gs:ge] = tmp
    if rank < 2 * r:  # unfold: 2i+1 hands the result back to 2i
        dist.send(buf, _peer(group, rank - 1), group=group)
    return _finish(tensor, buf, op, W)


def tree_broadcast(tensor, src=0, group=None):
    """Binomial-tree broadcast from group rank ``src``, in place."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPES:
        raise TypeError(f"unsupported dtype {tensor.dtype}; supported: {DTYPES}")
    rank, W = dist.get_rank(group), dist.get_world_size(group)
    _check_root(src, W, "src")
    if W == 1 or tensor.numel() == 0:
        return tensor
    v = (rank - src) % W
    low = v & -v if v else 1 << (W - 1).bit_length()  # children are v + m for m < lowbit(v)
    buf = tensor.reshape(-1).clone()
    if v:
        dist.recv(buf, _peer(group, (v - low + src) % W), group=group)
        tensor.copy_(buf.view(tensor.shape))
    m = low >> 1
    while m:
        if v + m < W:
            dist.send(buf, _peer(group, (v + m + src) % W), group=group)
        m >>= 1
    return tensor


def tree_reduce(tensor, dst=0, op="sum", group=None):
    """Binomial-tree reduce to group rank ``dst``; other ranks' tensors are left unchanged."""
    _check(tensor, op)
    rank, W = dist.get_rank(group), dist.get_world_size(group)
    _check_root(dst, W, "dst")
    if tensor.numel() == 0:
        return tensor
    v = (rank - dst) % W
    acc = tensor.reshape(-1).to(_acc_dtype(tensor.dtype), copy=True)  # a scratch buffer
    tmp = torch.empty_like(acc)
    m = 1
    while m < W and (v == 0 or m < (v & -v)):
        if v + m < W:
            dist.recv(tmp, _peer(group, (v + m + dst) % W), group=group)
            _combine(acc, tmp, op)
        m <<= 1
    if v:
        dist.send(acc, _peer(group, (v - (v & -v) + dst) % W), group=group)
        return tensor
    return _finish(tensor, acc, op, W)


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
    """Intra-node and inter-node groups over ``ranks`` (collective over the world)."""
    if isinstance(local_size, bool) or not isinstance(local_size, int):
        raise TypeError(f"local_size must be an int, got {type(local_size).__name__}")
    world = dist.get_world_size()
    ranks = list(range(world)) if ranks is None else list(ranks)
    if not ranks or any(isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < world for g in ranks) \
            or ranks != sorted(set(ranks)):
        raise ValueError(f"ranks must be distinct global ranks in ascending order, got {ranks}")
    if local_size < 1 or len(ranks) % local_size:
        raise ValueError(f"local_size={local_size} must be >= 1 and divide len(ranks)={len(ranks)}")
    L, n = local_size, len(ranks) // local_size
    intra = [dist.new_group(ranks[i * L:(i + 1) * L]) for i in range(n)]
    inter = [dist.new_group(ranks[j::L]) for j in range(L)]
    me = dist.get_rank()
    if me not in ranks:
        return None
    i = ranks.index(me)
    return Hierarchy(tuple(ranks), L, n, i, i // L, i % L, intra[i // L], inter[i % L])


def _ring_reduce_scatter(buf, size, me, group, op, shift):
    """Ring reduce-scatter of ``buf`` (size equal chunks) in place; chunk (me + shift) % size ends reduced."""
    c = buf.numel() // size
    chunk = lambda i: buf[(i % size) * c:(i % size + 1) * c]
    tmp = torch.empty(c, dtype=buf.dtype)
    right, left = (me + 1) % size, (me - 1) % size
    for s in range(size - 1):
        reqs = [dist.isend(chunk(me + shift - s - 1).clone(), _peer(group, right), group=group),
                dist.irecv(tmp, _peer(group, left), group=group)]
        for q in reqs:
            q.wait()
        _combine(chunk(me + shift - s - 2), tmp, op)


def _ring_all_gather(buf, size, me, group, shift):
    """Ring all-gather: chunk (me + shift) % size is this rank's; afterwards every chunk is filled."""
    c = buf.numel() // size
    chunk = lambda i: buf[(i % size) * c:(i % size + 1) * c]
    tmp = torch.empty(c, dtype=buf.dtype)
    right, left = (me + 1) % size, (me - 1) % size
    for s in range(size - 1):
        reqs = [dist.isend(chunk(me + shift - s).clone(), _peer(group, right), group=group),
                dist.irecv(tmp, _peer(group, left), group=group)]
        for q in reqs:
            q.wait()
        chunk(me + shift - s - 1).copy_(tmp)


def hierarchical_all_reduce(tensor, hierarchy, op="sum"):
    """Reduce-scatter in the node, all-reduce of the chunk across nodes, all-gather in the node."""
    _check(tensor, op)
    h = hierarchy
    L, n, N = h.local_size, h.num_nodes, tensor.numel()
    W = L * n
    if W == 1 or N == 0:
        return _finish(tensor, tensor.reshape(-1).to(_acc_dtype(tensor.dtype)), op, 1)
    c = -(-N // L)
    buf = torch.zeros(L * c, dtype=_acc_dtype(tensor.dtype))
    buf[:N] = tensor.reshape(-1)
    if L > 1:
        _ring_reduce_scatter(buf, L, h.local_rank, h.intra_group, op, 0)
    mine = buf[h.local_rank * c:(h.local_rank + 1) * c]
    if n > 1:  # ring all-reduce of this rank's chunk among the ranks of the same local rank
        d = -(-c // n)
        part = torch.zeros(n * d, dtype=buf.dtype)
        part[:c] = mine
        _ring_reduce_scatter(part, n, h.node, h.inter_group, op, 0)
        _ring_all_gather(part, n, h.node, h.inter_group, 0)
        mine.copy_(part[:c])
    if L > 1:
        _ring_all_gather(buf, L, h.local_rank, h.intra_group, 0)
    return _finish(tensor, buf[:N], op, W)


def _check_model(world_size, local_size, values):
    for name, v in (("world_size", world_size), ("local_size", local_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < 1:
            raise ValueError(f"{name}={v} must be >= 1")
    if world_size % local_size:
        raise ValueError(f"local_size={local_size} must divide world_size={world_size}")
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name}={v!r} must be a finite number >= 0")


def allreduce_time(algorithm, n_bytes, world_size, local_size, alpha_intra, beta_intra, alpha_inter,
                   beta_inter):
    """Seconds one all-reduce of ``n_bytes`` takes under the alpha-beta model (contract closed forms)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    _check_model(world_size, local_size, {"n_bytes": n_bytes, "alpha_intra": alpha_intra, "beta_intra": beta_intra,
                                          "alpha_inter": alpha_inter, "beta_inter": beta_inter})
    P, L, n = world_size, local_size, float(n_bytes)
    if P == 1:
        return 0.0
    m = P // L
    intra, inter = (alpha_intra, beta_intra), (alpha_inter, beta_inter)
    if algorithm == "ring":
        a, b = intra if m == 1 else inter
        return 2 * (P - 1) * (a + n / P * b)
    if algorithm == "hierarchical":
        return 2 * (L - 1) * (alpha_intra + n / L * beta_intra) + 2 * (m - 1) * (alpha_inter + n / P * beta_inter)
    q = 1 << (P.bit_length() - 1)
    r = P - q
    t = 0.0
    for j in range(q.bit_length() - 1):
        a, b = intra if m == 1 or (r == 0 and L % (1 << (j + 1)) == 0) else inter
        t += 2 * (a + n / (1 << (j + 1)) * b)
    if r:
        a, b = intra if m == 1 or L % 2 == 0 else inter
        t += 2 * (a + n * b)
    return t


def choose_allreduce(n_bytes, world_size, local_size, alpha_intra, beta_intra, alpha_inter, beta_inter):
    """The algorithm with the smallest modelled time (ties within 1e-9 to the earlier name)."""
    times = [allreduce_time(a, n_bytes, world_size, local_size, alpha_intra, beta_intra, alpha_inter, beta_inter)
             for a in ALGORITHMS]
    best = min(times)
    return next(a for a, t in zip(ALGORITHMS, times) if t <= best + 1e-9 * abs(best))


# --- Part C: diagnosing a hung collective ---------------------------------------------------------

def _shapes(ts):
    return [list(t.shape) for t in ts]


def _dtypes(ts):
    return [str(t.dtype).removeprefix("torch.") for t in ts]


_PARAMS = {"all_reduce": ("tensor", "op", "group"), "broadcast": ("tensor", "src", "group"),
           "reduce": ("tensor", "dst", "op", "group"), "all_gather": ("tensor_list", "tensor", "group"),
           "all_gather_into_tensor": ("output_tensor", "input_tensor", "group"),
           "reduce_scatter_tensor": ("output", "input", "op", "group"), "barrier": ("group",)}


def _io(name, a):
    """(inputs, outputs) tensors of a recorded call, from its bound arguments."""
    if name in ("all_reduce", "broadcast", "reduce"):
        return [a["tensor"]], [a["tensor"]]
    if name == "all_gather":
        return [a["tensor"]], list(a["tensor_list"])
    if name == "all_gather_into_tensor":
        return [a["input_tensor"]], [a["output_tensor"]]
    if name == "reduce_scatter_tensor":
        return [a["input"]], [a["output"]]
    return [], []


class FlightRecorder:
    """Record every collective of ``RECORDED_OPS`` this rank enters; dump the trace on exit."""

    def __init__(self, dump_dir):
        self.dump_dir = str(dump_dir)
        self.entries = []
        self._seq = Counter()
        self._saved = {}

    def _wrap(self, name, original):
        def recorded(*args, **kwargs):
            a = {**dict(zip(_PARAMS[name], args)), **kwargs}  # torch's own parameter names
            group = a.get("group")
            if group is None or group is dist.GroupMember.WORLD:
                group = dist.group.WORLD
            if dist.get_rank(group) < 0:  # not a member: torch makes the call a no-op
                return original(*args, **kwargs)
            pg = group.group_name
            self._seq[pg] += 1
            ins, outs = _io(name, a)
            entry = {"record_id": len(self.entries), "pg_name": pg,
                     "pg_ranks": sorted(dist.get_process_group_ranks(group)),
                     "collective_seq_id": self._seq[pg], "op": name,
                     "input_sizes": _shapes(ins), "output_sizes": _shapes(outs),
                     "input_dtypes": _dtypes(ins), "output_dtypes": _dtypes(outs), "state": "started"}
            self.entries.append(entry)
            out = original(*args, **kwargs)
            entry["state"] = "completed"
            return out
        recorded.__name__ = name
        return recorded

    def __enter__(self):
        for name in RECORDED_OPS:
            original = getattr(dist, name)
            self._saved[name] = original
            setattr(dist, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved = {}
        os.makedirs(self.dump_dir, exist_ok=True)
        doc = self.trace()
        with open(os.path.join(self.dump_dir, f"rank{doc['rank']}.json"), "w") as f:
            json.dump(doc, f)
        return False

    def trace(self):
        return {"version": TRACE_VERSION, "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "entries": [dict(e) for e in self.entries]}


_KEYS = ("pg_name", "pg_ranks", "collective_seq_id", "op", "input_sizes", "output_sizes", "input_dtypes",
         "output_dtypes", "state")


def _plain(x):
    return [_plain(y) for y in x] if isinstance(x, (list, tuple)) else x


def diagnose(traces):
    """Findings per process group and the culprit ranks of a hung job (contract rules 1-3)."""
    traces = list(traces)
    if not traces:
        raise ValueError("no traces")
    W = traces[0]["world_size"]
    by_rank = {}
    for t in traces:
        if t["world_size"] != W:
            raise ValueError(f"different world sizes: {W} and {t['world_size']}")
        if t["rank"] in by_rank:
            raise ValueError(f"rank {t['rank']} appears twice")
        by_rank[t["rank"]] = t
    if sorted(by_rank) != list(range(W)):
        raise ValueError(f"expected one trace per rank 0..{W - 1}, got ranks {sorted(by_rank)}")
    members, table, waits = {}, {}, set()
    for rank, t in by_rank.items():
        for e in t["entries"]:
            missing = [k for k in _KEYS if k not in e]
            if missing:
                raise ValueError(f"rank {rank}: an entry lacks {missing}")
            pg, ranks = e["pg_name"], _plain(e["pg_ranks"])
            if members.setdefault(pg, ranks) != ranks:
                raise ValueError(f"group {pg!r} has members {members[pg]} and {ranks}")
            if rank not in ranks:
                raise ValueError(f"rank {rank} recorded on group {pg!r}, which excludes it")
            if e["state"] not in STATES:
                raise ValueError(f"rank {rank}: state {e['state']!r} is not one of {STATES}")
            key = (pg, e["collective_seq_id"], rank)
            if key in table:
                raise ValueError(f"rank {rank}: two entries on group {pg!r} with seq {key[1]}")
            table[key] = e
            if e["state"] != "completed":
                waits.add(rank)
    findings = []
    for pg in sorted(members):
        ranks = members[pg]
        top = max(s for (g, s, _) in table if g == pg)
        for k in range(1, top + 1):
            absent = [r for r in ranks if (pg, k, r) not in table]
            if absent:
                findings.append({"pg": pg, "seq": k, "kind": "missing", "ranks": absent})
                break
            found = None
            for kind, fields in (("op_mismatch", ("op",)), ("size_mismatch", ("input_sizes", "output_sizes")),
                                 ("dtype_mismatch", ("input_dtypes", "output_dtypes"))):
                vals = {r: json.dumps([_plain(table[pg, k, r][f]) for f in fields]) for r in ranks}
                if len(set(vals.values())) > 1:
                    counts = Counter(vals.values())
                    ref = max(counts, key=lambda v: (counts[v], -min(r for r in ranks if vals[r] == v)))
                    found = {"pg": pg, "seq": k, "kind": kind, "ranks": [r for r in ranks if vals[r] != ref]}
                    break
            if found:
                findings.append(found)
                break
    culprits = set()
    for f in findings:
        culprits |= {r for r in f["ranks"] if f["kind"] != "missing" or r not in waits}
    if not culprits:
        culprits = {r for f in findings if f["kind"] == "missing" for r in f["ranks"]}
    return {"findings": findings, "culprits": sorted(culprits)}


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
