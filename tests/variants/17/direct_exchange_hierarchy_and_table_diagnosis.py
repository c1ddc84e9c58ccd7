"""Parts B and C written another way, appended after the reference so they replace it: the hierarchical
all-reduce uses direct exchanges instead of rings at both levels (every rank sends chunk j straight to its
owner j, the owner reduces the pieces in rank order and sends the result straight back: the same element counts
as a ring, fewer steps); make_hierarchy builds its groups in one list; the cost model sums per-round lists;
the recorder wraps with functools.wraps and keeps one counter dict per group name; diagnose builds a table per
group with defaultdicts and picks the reference value by sorting. Proves: the graders read the contract's
bounds and results, not the ring or the reference's data structures."""
MAY_FAIL = []
SELECT = ("cost or time or choose or recorder or diagnose or make_hierarchy or (hierarchical and (W6 or 6-3 or avg_and_half "
          "or identical_bits or subset))")
MUTATE = [('''    return {"names": names, "results": results, "error": error, "trace": rec.trace(), "dump": dump,
            "restored": restored}
''', '''    return {"names": names, "results": results, "error": error, "trace": rec.trace(), "dump": dump,
            "restored": restored}


# --- the variant: Parts B and C again ----------------------------------------------------------------

import functools  # noqa: E402
from collections import defaultdict  # noqa: E402


def make_hierarchy(local_size, ranks=None):  # noqa: F811 - replaces the reference's
    if type(local_size) is not int:
        raise TypeError(f"local_size must be an int, not {type(local_size).__name__}")
    world = dist.get_world_size()
    members = list(range(world)) if ranks is None else list(ranks)
    if not members or len(set(members)) != len(members) or members != sorted(members) \\
            or not all(type(g) is int and 0 <= g < world for g in members):
        raise ValueError(f"ranks must be distinct ascending global ranks: {members}")
    if local_size < 1 or len(members) % local_size != 0:
        raise ValueError(f"local_size={local_size} must be >= 1 and divide {len(members)}")
    L = local_size
    n = len(members) // L
    made = {}
    for key, sub in [(("node", i), members[i * L:(i + 1) * L]) for i in range(n)] + \\
                    [(("local", j), members[j::L]) for j in range(L)]:
        made[key] = dist.new_group(sub)
    me = dist.get_rank()
    if me not in members:
        return None
    i = members.index(me)
    return Hierarchy(ranks=tuple(members), local_size=L, num_nodes=n, rank=i, node=i // L, local_rank=i % L,
                     intra_group=made["node", i // L], inter_group=made["local", i % L])


def _direct_reduce_scatter(pieces, me, group, op):
    """pieces[j] goes to group rank j; returns my piece reduced over the group in rank order."""
    size = len(pieces)
    got = [pieces[me] if j == me else torch.empty_like(pieces[me]) for j in range(size)]
    ops = []
    for j in range(size):
        if j != me:
            ops.append(dist.P2POp(dist.isend, pieces[j].contiguous(), group=group, group_peer=j))
            ops.append(dist.P2POp(dist.irecv, got[j], group=group, group_peer=j))
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()
    acc = got[0].clone()
    for j in range(1, size):
        _combine(acc, got[j], op)
    return acc


def _direct_all_gather(mine, me, size, group):
    out = [mine if j == me else torch.empty_like(mine) for j in range(size)]
    ops = []
    for j in range(size):
        if j != me:
            ops.append(dist.P2POp(dist.isend, mine, group=group, group_peer=j))
            ops.append(dist.P2POp(dist.irecv, out[j], group=group, group_peer=j))
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()
    return torch.cat(out)


def hierarchical_all_reduce(tensor, hierarchy, op="sum"):  # noqa: F811
    _check(tensor, op)
    L, n, N = hierarchy.local_size, hierarchy.num_nodes, tensor.numel()
    if L * n == 1 or N == 0:
        return _finish(tensor, tensor.reshape(-1).to(_acc_dtype(tensor.dtype)), op, 1)
    c = -(-N // L)
    full = torch.zeros(L * c, dtype=_acc_dtype(tensor.dtype))
    full[:N] = tensor.reshape(-1)
    chunk = _direct_reduce_scatter(list(full.split(c)), hierarchy.local_rank, hierarchy.intra_group, op)
    d = -(-c // n)
    padded = torch.zeros(n * d, dtype=chunk.dtype)
    padded[:c] = chunk
    piece = _direct_reduce_scatter(list(padded.split(d)), hierarchy.node, hierarchy.inter_group, op)
    chunk = _direct_all_gather(piece, hierarchy.node, n, hierarchy.inter_group)[:c].contiguous()
    full = _direct_all_gather(chunk, hierarchy.local_rank, L, hierarchy.intra_group)
    return _finish(tensor, full[:N], op, L * n)


def allreduce_time(algorithm, n_bytes, world_size, local_size, alpha_intra, beta_intra, alpha_inter,  # noqa: F811
                   beta_inter):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not one of {ALGORITHMS}")
    _check_model(world_size, local_size, dict(n_bytes=n_bytes, alpha_intra=alpha_intra, beta_intra=beta_intra,
                                              alpha_inter=alpha_inter, beta_inter=beta_inter))
    P, L = world_size, local_size
    if P == 1:
        return 0.0
    m = P // L
    link = {True: (alpha_intra, beta_intra), False: (alpha_inter, beta_inter)}
    rounds = []  # (is_intra, messages, bytes per message)
    if algorithm == "ring":
        rounds = [(m == 1, 2 * (P - 1), n_bytes / P)]
    elif algorithm == "hierarchical":
        rounds = [(True, 2 * (L - 1), n_bytes / L), (False, 2 * (m - 1), n_bytes / P)]
    else:
        k = P.bit_length() - 1
        r = P - (1 << k)
        rounds = [(m == 1 or (r == 0 and L % (2 << j) == 0), 2, n_bytes / (2 << j)) for j in range(k)]
        if r:
            rounds.append((m == 1 or L % 2 == 0, 2, n_bytes))
    return sum(msgs * (link[intra][0] + size * link[intra][1]) for intra, msgs, size in rounds)


def choose_allreduce(n_bytes, world_size, local_size, alpha_intra, beta_intra, alpha_inter, beta_inter):  # noqa: F811
    times = {a: allreduce_time(a, n_bytes, world_size, local_size, alpha_intra, beta_intra, alpha_inter, beta_inter)
             for a in ALGORITHMS}
    low = min(times.values())
    for a in ALGORITHMS:
        if times[a] - low <= 1e-9 * abs(low):
            return a


class FlightRecorder:  # noqa: F811
    def __init__(self, dump_dir):
        self.dump_dir = str(dump_dir)
        self.entries, self.counters, self.originals = [], defaultdict(int), {}

    def _recording(self, name, fn):
        params = _PARAMS[name]

        @functools.wraps(fn)
        def call(*args, **kwargs):
            bound = dict(zip(params, args))
            bound.update(kwargs)
            pg = bound.get("group") or dist.group.WORLD
            if pg is dist.GroupMember.NON_GROUP_MEMBER or dist.get_rank(pg) == -1:
                return fn(*args, **kwargs)
            ins, outs = _io(name, bound)
            self.counters[pg.group_name] += 1
            rec = dict(record_id=len(self.entries), pg_name=pg.group_name,
                       pg_ranks=sorted(dist.get_process_group_ranks(pg)),
                       collective_seq_id=self.counters[pg.group_name], op=name,
                       input_sizes=[list(t.shape) for t in ins], output_sizes=[list(t.shape) for t in outs],
                       input_dtypes=[str(t.dtype)[6:] for t in ins], output_dtypes=[str(t.dtype)[6:] for t in outs],
                       state="started")
            self.entries.append(rec)
            result = fn(*args, **kwargs)
            rec["state"] = "completed"
            return result
        return call

    def __enter__(self):
        self.originals = {name: getattr(dist, name) for name in RECORDED_OPS}
        for name, fn in self.originals.items():
            setattr(dist, name, self._recording(name, fn))
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            for name, fn in self.originals.items():
                setattr(dist, name, fn)
        finally:
            doc = self.trace()
            os.makedirs(self.dump_dir, exist_ok=True)
            with open(os.path.join(self.dump_dir, "rank%d.json" % doc["rank"]), "w") as f:
                f.write(json.dumps(doc))
        return False

    def trace(self):
        return {"version": TRACE_VERSION, "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "entries": [dict(e) for e in self.entries]}


def diagnose(traces):  # noqa: F811
    traces = list(traces)
    if len(traces) == 0:
        raise ValueError("diagnose needs at least one trace")
    sizes = {t["world_size"] for t in traces}
    if len(sizes) != 1:
        raise ValueError(f"world sizes differ: {sorted(sizes)}")
    ranks = [t["rank"] for t in traces]
    if sorted(ranks) != list(range(sizes.pop())):
        raise ValueError(f"need exactly one trace per rank, got {sorted(ranks)}")
    groups = {}
    cell = defaultdict(dict)           # (pg, seq) -> rank -> entry
    waiting = set()
    for t in traces:
        for e in t["entries"]:
            for k in _KEYS:
                if k not in e:
                    raise ValueError(f"entry without {k!r} on rank {t['rank']}")
            members = [int(x) for x in e["pg_ranks"]]
            if groups.setdefault(e["pg_name"], members) != members:
                raise ValueError(f"group {e['pg_name']!r} has two member lists")
            if t["rank"] not in members:
                raise ValueError(f"rank {t['rank']} is not a member of {e['pg_name']!r}")
            if e["state"] not in STATES:
                raise ValueError(f"bad state {e['state']!r}")
            slot = cell[e["pg_name"], e["collective_seq_id"]]
            if t["rank"] in slot:
                raise ValueError(f"duplicate seq {e['collective_seq_id']} on {e['pg_name']!r}")
            slot[t["rank"]] = e
            waiting |= {t["rank"]} if e["state"] != "completed" else set()
    findings = []
    for pg in sorted(groups):
        members = groups[pg]
        last = max(seq for (g, seq) in cell if g == pg)
        for seq in range(1, last + 1):
            row = cell.get((pg, seq), {})
            lacking = [r for r in members if r not in row]
            if lacking:
                findings.append({"pg": pg, "seq": seq, "kind": "missing", "ranks": lacking})
                break
            odd = None
            for kind, keys in [("op_mismatch", ["op"]), ("size_mismatch", ["input_sizes", "output_sizes"]),
                               ("dtype_mismatch", ["input_dtypes", "output_dtypes"])]:
                value = {r: repr([_plain(row[r][k]) for k in keys]) for r in members}
                if len(set(value.values())) > 1:
                    tally = Counter(value.values())
                    best = sorted(members, key=lambda r: (-tally[value[r]], r))[0]
                    odd = {"pg": pg, "seq": seq, "kind": kind,
                           "ranks": [r for r in members if value[r] != value[best]]}
                    break
            if odd is not None:
                findings.append(odd)
                break
    blamed = sorted({r for f in findings for r in f["ranks"] if f["kind"] != "missing" or r not in waiting})
    if not blamed:
        blamed = sorted({r for f in findings if f["kind"] == "missing" for r in f["ranks"]})
    return {"findings": findings, "culprits": blamed}
''')]
