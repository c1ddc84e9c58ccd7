"""Hidden graders of lab 17, part C: the flight recorder and the diagnosis of a hung collective.

``FlightRecorder`` is graded on real collective programs among W = 4 sandboxed gloo ranks, run by
the stub's given ``run_collectives`` under the submission's recorder: the entries of a program that
completes (every field, per group), that the recorder changes no result and puts torch.distributed
back, that calls on groups a rank is not in are not recorded, and three real hangs with a 2 s
timeout (a rank skips the last all-reduce; a rank calls it with another size; a rank leaves a
pair-group collective while the others wait in the world and in the pair). A hang's dumps must show
the timed-out call as not completed, and the contract's diagnosis (this file's ``contract_diagnose``)
on them must name the planted rank.

``diagnose`` is graded on designed traces, one rule each, and on 300 simulated hung jobs (2-8 ranks,
the world and up to six sub-groups, 0-2 planted faults) against ``contract_diagnose``.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
from collections import Counter

import pytest
import torch

from harness.toolkit import expect_raises, run_ranks, source

T = 30.0          # seconds per run (a hang ends at its 2 s group timeout)
HANG_S = 2.0
KEYS = ("pg_name", "pg_ranks", "collective_seq_id", "op", "input_sizes", "output_sizes", "input_dtypes",
        "output_dtypes", "state")
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier")


# ----------------------------------------------------------------------------- the contract's diagnosis

def contract_diagnose(traces):
    """Rules 1-3 of the contract (the oracle; inputs assumed valid)."""
    members, table, waits = {}, {}, set()
    for t in traces:
        for e in t["entries"]:
            members[e["pg_name"]] = list(e["pg_ranks"])
            table[e["pg_name"], e["collective_seq_id"], t["rank"]] = e
            if e["state"] != "completed":
                waits.add(t["rank"])
    findings = []
    for pg in sorted(members):
        ranks = members[pg]
        for k in range(1, max(s for (g, s, _) in table if g == pg) + 1):
            absent = [r for r in ranks if (pg, k, r) not in table]
            if absent:
                findings.append({"pg": pg, "seq": k, "kind": "missing", "ranks": absent})
                break
            hit = None
            for kind, fields in (("op_mismatch", ("op",)), ("size_mismatch", ("input_sizes", "output_sizes")),
                                 ("dtype_mismatch", ("input_dtypes", "output_dtypes"))):
                vals = {r: json.dumps([table[pg, k, r][f] for f in fields]) for r in ranks}
                count = Counter(vals.values())
                if len(count) > 1:
                    top = max(count.values())
                    ref = vals[min(r for r in ranks if count[vals[r]] == top)]
                    hit = {"pg": pg, "seq": k, "kind": kind, "ranks": [r for r in ranks if vals[r] != ref]}
                    break
            if hit:
                findings.append(hit)
                break
    culprits = {r for f in findings for r in f["ranks"] if f["kind"] != "missing" or r not in waits}
    if not culprits:
        culprits = {r for f in findings if f["kind"] == "missing" for r in f["ranks"]}
    return {"findings": findings, "culprits": sorted(culprits)}


def as_plain(x):
    if isinstance(x, dict):
        return {k: as_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [as_plain(v) for v in x]
    return x


def check_diagnosis(got, want, case):
    got = as_plain(got)
    if not isinstance(got, dict) or set(got) < {"findings", "culprits"}:
        raise AssertionError(f"diagnose must return {{'findings': [...], 'culprits': [...]}} ({case}): got {got!r}"[:600])
    if got["findings"] != want["findings"]:
        g, w = got["findings"], want["findings"]
        first = next((i for i in range(max(len(g), len(w))) if i >= len(g) or i >= len(w) or g[i] != w[i]), 0)
        kind = (w[first]["kind"] if first < len(w) else "no finding")
        raise AssertionError(f"wrong finding ({kind} rule) ({case}): finding {first} is "
                             f"{g[first] if first < len(g) else 'absent'}, the contract's is "
                             f"{w[first] if first < len(w) else 'none'} (all: {w})"[:1500])
    if got["culprits"] != want["culprits"]:
        raise AssertionError(f"wrong culprits ({case}): got {got['culprits']}, the contract's rules give "
                             f"{want['culprits']} (findings {want['findings']})"[:1500])


# ----------------------------------------------------------------------------- real programs

GIVEN_DRIVER = "21d5190c3d5c942e"   # sha256 (16 hex) of the given run_collectives' AST, docstring left out


def given_driver_unchanged(impl):
    """The recorder is graded through the stub's given ``run_collectives``: it must be the given one,
    bound once (a driver that builds its trace from the program, not from the calls, would grade nothing)."""
    tree = ast.parse(source(impl))
    binds = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
             and n.name == "run_collectives"]
    binds += [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "run_collectives"
              and isinstance(n.ctx, (ast.Store, ast.Del))]
    binds += [n for n in ast.walk(tree) if isinstance(n, ast.alias) and (n.asname or n.name) == "run_collectives"]
    fn = binds[0] if len(binds) == 1 and isinstance(binds[0], ast.FunctionDef) else None
    if fn is not None and fn in tree.body:
        body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) else fn.body
        fn = ast.FunctionDef(fn.name, fn.args, body, fn.decorator_list, fn.returns, fn.type_comment)
        if hashlib.sha256(ast.dump(fn).encode()).hexdigest()[:16] == GIVEN_DRIVER:
            return
    raise AssertionError("run_collectives is not the given one (it is bound more than once or its code changed): "
                         "the recorder is graded through the given driver; restore it from the stub")

def step(op, group, numel=6, dtype="float32", shape=None):
    return {"op": op, "group": group, "shape": list(shape or [numel]), "dtype": dtype}


def run_program(impl, groups, steps, dump_dir):
    given_driver_unchanged(impl)
    return run_ranks(body_program, len(groups[0]), groups, steps, dump_dir, impl=impl, timeout=T)


def body_program(rk, groups, steps_of, dump_dir):
    return rk.impl.run_collectives(groups, steps_of[rk.rank], dump_dir, HANG_S)


def io_of(s, size):
    """(input_sizes, output_sizes, input_dtypes, output_dtypes) of a step as the contract records them."""
    shape, d = s["shape"], s["dtype"]
    n = shape[0]
    ins, outs = {"all_reduce": ([shape], [shape]), "broadcast": ([shape], [shape]), "reduce": ([shape], [shape]),
                 "all_gather": ([[n]], [[n]] * size), "all_gather_into_tensor": ([[n]], [[n * size]]),
                 "reduce_scatter_tensor": ([[n]], [[n // size]]), "barrier": ([], [])}[s["op"]]
    return ins, outs, [d] * len(ins), [d] * len(outs)


def expected_entries(rank, groups, steps, names, completed):
    out, seq = [], Counter()
    for i, s in enumerate(steps):
        members = groups[s["group"]]
        if rank not in members:
            continue
        pg = names[s["group"]]
        seq[pg] += 1
        ins, outs, di, do = io_of(s, len(members))
        out.append({"pg_name": pg, "pg_ranks": sorted(members), "collective_seq_id": seq[pg], "op": s["op"],
                    "input_sizes": ins, "output_sizes": outs, "input_dtypes": di, "output_dtypes": do,
                    "state": "completed" if i < completed else "started", "record_id": len(out)})
    return out


def check_trace(doc, rank, W, want, what):
    if not isinstance(doc, dict) or doc.get("rank") != rank or doc.get("world_size") != W \
            or not isinstance(doc.get("entries"), list) or not isinstance(doc.get("version"), str):
        raise AssertionError(f"{what}: rank {rank}'s trace must be {{'version': str, 'rank': {rank}, 'world_size': "
                             f"{W}, 'entries': [...]}}; got {str(doc)[:300]}")
    got = doc["entries"]
    if len(got) != len(want):
        raise AssertionError(f"{what}: rank {rank} recorded {len(got)} entries, the program made {len(want)} recorded "
                             f"calls (ops {[e['op'] for e in want]}; got {[e.get('op') for e in got]})")
    for i, (g, w) in enumerate(zip(got, want)):
        for key, value in w.items():
            if as_plain(g.get(key)) != value:
                raise AssertionError(f"{what}: rank {rank}, entry {i} ({w['op']} on group {w['pg_name']!r}): "
                                     f"{key} is {g.get(key)!r}, expected {value!r}")


def fresh_dir(seed, tag):
    return f"/tmp/lab17-fr-{tag}-{seed % 10**9}"


def complete_program(W):
    """Groups: a full group (the program's world), two pairs, and one that leaves rank 0 out. The two
    pairs interleave their collective differently with the world's (record ids differ across ranks)."""
    groups = [list(range(W)), [0, 1], [2, 3], [1, 2, 3]]
    world = [step("all_reduce", 0, 5), step("broadcast", 0, 3, "float64"), step("reduce", 0, 4, "int64"),
             step("all_gather", 0, 2), step("all_gather_into_tensor", 0, 3, "bfloat16"),
             step("reduce_scatter_tensor", 0, 8), step("barrier", 0)]
    steps = []
    for r in range(W):
        pair = 1 if r < 2 else 2
        mine = list(world)
        mine.insert(2 if r < 2 else 5, step("all_reduce", pair, 3, "float64"))
        if r >= 1:
            mine.insert(1, step("all_gather_into_tensor", 3, 2))
        steps.append(mine)
    return groups, steps


def known_results(groups, s, rank):
    members = groups[s["group"]]
    n, dt = s["shape"][0], getattr(torch, s["dtype"])
    vals = [g + 1.0 for g in sorted(members)]
    if s["op"] == "all_reduce":
        return torch.full((n,), sum(vals), dtype=dt)
    if s["op"] == "broadcast":
        return torch.full((n,), vals[0], dtype=dt)
    if s["op"] == "reduce":
        return torch.full((n,), sum(vals), dtype=dt) if rank == sorted(members)[0] else None  # gloo leaves partials
    if s["op"] == "all_gather":
        return torch.stack([torch.full((n,), v, dtype=dt) for v in vals])
    if s["op"] == "all_gather_into_tensor":
        return torch.cat([torch.full((n,), v, dtype=dt) for v in vals])
    if s["op"] == "reduce_scatter_tensor":
        return torch.full((n // len(members),), sum(vals), dtype=dt)
    return torch.zeros(0)


@pytest.fixture(scope="module")
def completed_runs():
    return {}


def completed_program(store, impl, seed, W=4):
    """(groups, steps, results) of ``complete_program(W)`` recorded, run once for the tests that grade it
    (the entries, the results): the first test's seed names its dump directory."""
    if "run" not in store:
        groups, steps = complete_program(W)
        try:
            store["run"] = (groups, steps, run_program(impl, groups, steps, fresh_dir(seed, "done")))
        except AssertionError as e:   # RankError / RankTimeout: the result of each test of it
            store["run"] = e
    if isinstance(store["run"], BaseException):
        raise AssertionError(str(store["run"]))
    return store["run"]


@pytest.mark.part("C")
@pytest.mark.points(3)
def test_recorder_entries_of_a_completed_program(impl, seed, completed_runs):
    W = 4
    groups, steps, res = completed_program(completed_runs, impl, seed, W)
    for r in range(W):
        if res[r]["error"]:
            raise AssertionError(f"the recorded program failed on rank {r}: {res[r]['error']}")
        want = expected_entries(r, groups, steps[r], res[r]["names"], len(steps[r]))
        check_trace(res[r]["trace"], r, W, want, "wrong flight-recorder entry")


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_recorder_changes_no_result_and_restores_torch_distributed(impl, seed, completed_runs):
    W = 4
    groups, steps, res = completed_program(completed_runs, impl, seed, W)
    for r in range(W):
        if res[r]["error"]:
            raise AssertionError(f"the recorder changed a call: the program failed on rank {r}: {res[r]['error']}")
        mine = [s for s in steps[r] if r in groups[s["group"]]]
        for s, got in zip(mine, res[r]["results"]):
            want = known_results(groups, s, r)
            if want is not None and not torch.equal(got, want):
                raise AssertionError(f"the recorder changed a collective's result (call it with the same arguments "
                                     f"and return what it returns): rank {r}, {s['op']} on {groups[s['group']]}: got "
                                     f"{got.reshape(-1)[:4].tolist()}, expected {want.reshape(-1)[:4].tolist()}")
        if not res[r]["restored"]:
            raise AssertionError(f"after the recorder's block, torch.distributed's functions are not the original "
                                 f"objects again (restore them in __exit__) (rank {r})")


@pytest.mark.part("C")
@pytest.mark.points(1)
def test_recorder_skips_calls_on_groups_the_rank_is_not_in(impl, seed):
    W = 4
    groups = [list(range(W)), [1, 3]]
    steps = [[step("all_reduce", 1, 2), step("all_reduce", 0, 3), step("barrier", 1)] for _ in range(W)]
    res = run_program(impl, groups, steps, fresh_dir(seed, "nonmember"))
    for r in range(W):
        if res[r]["error"]:
            raise AssertionError(f"the recorded program failed on rank {r}: {res[r]['error']}")
        want = expected_entries(r, groups, steps[r], res[r]["names"], len(steps[r]))
        check_trace(res[r]["trace"], r, W, want, "recorded a call on a group the rank is not in (torch makes it a "
                    "no-op; record only the groups this rank belongs to)")


def hang_case(kind, W=4):
    """(groups, steps, the planted rank). Rank ``bad`` is never 0 (it serves
    the run's store)."""
    groups = [list(range(W)), [2, 3]]
    base = [step("all_reduce", 0, 5), step("broadcast", 0, 4), step("all_reduce", 0, 7)]
    steps = [list(base) for _ in range(W)]
    bad = 2
    if kind == "skip":
        steps[bad] = base[:2]
    elif kind == "size":  # same elements, another shape: gloo moves the bytes, the trace shows the mismatch;
        steps = [base + [step("all_reduce", 0, 5)] for _ in range(W)]   # then the others wait for the leaver
        steps[bad] = base[:2] + [step("all_reduce", 0, shape=[1, 7])]
    else:  # rank 3 waits in the pair collective its partner left; ranks 0, 1 wait in the world
        bad = 2
        steps = [base[:2] + [step("all_reduce", 0, 7)] for _ in range(2)] + [base[:2], base[:2] + [step("all_reduce", 1, 3)]]
    return groups, steps, bad


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("kind", ["skip", "size", "pair"])
def test_recorder_real_hang_dumps_name_the_culprit(kind, impl, seed):
    W = 4
    groups, steps, bad = hang_case(kind, W)
    res = run_program(impl, groups, steps, fresh_dir(seed, kind))
    traces = []
    for r in range(W):
        doc = res[r]["dump"]
        if doc is None:
            raise AssertionError(f"no dump written: after the block (here ended by a timed-out collective) the trace "
                                 f"must be in <dump_dir>/rank{r}.json ({kind}, rank {r})")
        if as_plain(doc) != as_plain(res[r]["trace"]):
            raise AssertionError(f"the dump differs from trace() ({kind}, rank {r})")
        finished = len(steps[r]) - (1 if res[r]["error"] else 0)   # a call that raised stays 'started'
        want = expected_entries(r, groups, steps[r], res[r]["names"], finished)
        check_trace(doc, r, W, want, f"a timed-out collective must stay 'started' ({kind} hang)")
        traces.append(doc)
    if not any(res[r]["error"] for r in range(W)):
        raise AssertionError(f"grader defect: the planted {kind} hang did not hang")
    got = contract_diagnose(traces)["culprits"]
    if got != [bad]:
        raise AssertionError(f"the dumps do not name the planted rank ({kind} hang): the contract's diagnosis "
                                 f"of them blames {got}, the planted culprit is rank {bad}")


# ----------------------------------------------------------------------------- designed traces

def entry(pg, ranks, seq, op="all_reduce", size=4, dtype="float32", state="completed", **extra):
    return {"pg_name": pg, "pg_ranks": list(ranks), "collective_seq_id": seq, "op": op, "input_sizes": [[size]],
            "output_sizes": [[size]], "input_dtypes": [dtype], "output_dtypes": [dtype], "state": state, **extra}


def doc(rank, W, entries):
    return {"version": "x", "rank": rank, "world_size": W,
            "entries": [dict(e, record_id=i) for i, e in enumerate(entries)]}


def designed(rule):
    """Traces where only ``rule`` decides the answer."""
    w5 = list(range(5))
    if rule == "stopped":      # rank 3 never reaches seq 2 and waits nowhere: it is the culprit
        return [doc(r, 5, [entry("0", w5, 1)] + ([entry("0", w5, 2, state="started")] if r != 3 else []))
                for r in range(5)]
    if rule == "cycle":        # 0 waits in group "a" for 1, 1 waits in "0" for 0
        return [doc(0, 2, [entry("0", [0, 1], 1), entry("a", [0, 1], 1, state="started")]),
                doc(1, 2, [entry("0", [0, 1], 1), entry("0", [0, 1], 2, state="started")])]
    if rule == "scheduled":    # a 'scheduled' entry waits too: rank 2 is a victim, not a culprit
        w3 = [0, 1, 2]
        return [doc(0, 3, [entry("0", w3, 1, state="started")]), doc(1, 3, [entry("0", w3, 1, state="started")]),
                doc(2, 3, [entry("p", [1, 2], 1, state="scheduled")])]
    if rule == "op":           # majority op all_reduce; rank 1 broadcasts
        return [doc(r, 4, [entry("0", range(4), 1, op="broadcast" if r == 1 else "all_reduce", state="started")])
                for r in range(4)]
    if rule == "tie":          # 2-2 tie: the value of the lowest rank (0) is the reference
        return [doc(r, 4, [entry("0", range(4), 1, size=8 if r in (2, 3) else 4, state="started")]) for r in range(4)]
    if rule == "dtype":
        return [doc(r, 3, [entry("0", range(3), 1, dtype="bfloat16" if r == 0 else "float32", state="started")])
                for r in range(3)]
    if rule == "interleaved":  # record order differs between ranks; (pg, seq) agree: no finding
        a = [entry("0", range(3), 1), entry("g", [0, 2], 1, size=2), entry("0", range(3), 2)]
        b = [a[0], a[2]]
        c = [a[1], a[0], a[2]]
        return [doc(0, 3, a), doc(1, 3, b), doc(2, 3, c)]
    raise ValueError(rule)


RULE_BUG = {"stopped": "a missing rank that waits nowhere is the culprit", "cycle": "a cycle blames every missing rank",
            "scheduled": "a 'scheduled' entry waits too", "op": "op_mismatch names the minority",
            "tie": "ties go to the value of the lowest rank", "dtype": "dtype_mismatch after op and sizes",
            "interleaved": "entries match by (pg_name, seq), never by record order"}


@pytest.mark.part("C")
@pytest.mark.points(1)
@pytest.mark.parametrize("rule", list(RULE_BUG))
def test_diagnose_designed_trace(rule, impl):
    traces = designed(rule)
    check_diagnosis(impl.diagnose(traces[::-1]), contract_diagnose(traces), f"rule: {RULE_BUG[rule]}")


# ----------------------------------------------------------------------------- simulated hung jobs

def _ri(gen, lo, hi):
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def simulate(gen):
    """A random job that hangs (or not): W ranks, the world and up to six sub-groups, a global program
    of collectives, 0-2 planted faults, then blocking progress until nothing can move."""
    W = _ri(gen, 2, 8)
    groups = {"0": list(range(W))}
    for i in range(_ri(gen, 0, 6)):
        k = _ri(gen, 1, W)
        groups[str(i + 1)] = sorted(torch.randperm(W, generator=gen)[:k].tolist())
    names = list(groups)
    program = []
    for _ in range(_ri(gen, 2, 10)):
        pg = names[_ri(gen, 0, len(names) - 1)]
        program.append({"pg": pg, "op": OPS[_ri(gen, 0, 2)], "size": _ri(gen, 1, 3), "dtype": "float32"})
    calls = {r: [dict(c) for c in program if r in groups[c["pg"]]] for r in range(W)}
    stop = {}
    for _ in range(_ri(gen, 0, 2)):
        r = _ri(gen, 0, W - 1)
        if not calls[r]:
            continue
        i = _ri(gen, 0, len(calls[r]) - 1)
        fault = _ri(gen, 0, 5)
        if fault == 0:
            stop[r] = min(stop.get(r, 99), i)
        elif fault == 1:
            del calls[r][i]
        elif fault == 2:
            calls[r][i]["size"] += 1
        elif fault == 3:
            calls[r][i]["dtype"] = "float16"
        elif fault == 4:
            calls[r][i]["op"] = "all_gather" if calls[r][i]["op"] != "all_gather" else "reduce"
        elif i + 1 < len(calls[r]):
            calls[r][i], calls[r][i + 1] = calls[r][i + 1], calls[r][i]
    for r, i in stop.items():
        calls[r] = calls[r][:i]
    # blocking progress: a call completes once every member's current call is the same (pg, seq) and matches
    pos = {r: 0 for r in range(W)}
    seqs = {r: [] for r in range(W)}
    for r in range(W):
        count = Counter()
        for c in calls[r]:
            count[c["pg"]] += 1
            seqs[r].append(count[c["pg"]])
    moved = True
    while moved:
        moved = False
        for r in range(W):
            if pos[r] >= len(calls[r]):
                continue
            c, k = calls[r][pos[r]], seqs[r][pos[r]]
            mem = groups[c["pg"]]
            here = [calls[q][pos[q]] if pos[q] < len(calls[q]) and calls[q][pos[q]]["pg"] == c["pg"]
                    and seqs[q][pos[q]] == k else None for q in mem]
            if all(h is not None and (h["op"], h["size"], h["dtype"]) == (c["op"], c["size"], c["dtype"]) for h in here):
                for q in mem:
                    pos[q] += 1
                moved = True
    traces = []
    for r in range(W):
        entries = []
        for i, c in enumerate(calls[r][:pos[r] + 1]):
            state = "completed" if i < pos[r] else ("scheduled" if _ri(gen, 0, 3) == 0 else "started")
            entries.append(entry(c["pg"], groups[c["pg"]], seqs[r][i], c["op"], c["size"], c["dtype"], state,
                                 time_created_ns=_ri(gen, 0, 10**6)))
        traces.append(doc(r, W, entries))
    order = torch.randperm(W, generator=gen).tolist()
    return [traces[i] for i in order]


@pytest.mark.part("C")
@pytest.mark.points(8)
def test_diagnose_simulated_hung_jobs(impl, gen):
    jobs = [simulate(gen) for _ in range(300)]
    jobs.sort(key=lambda t: (len(t), sum(len(d["entries"]) for d in t)))  # the smallest failing case first
    for j, traces in enumerate(jobs):
        want = contract_diagnose(traces)
        check_diagnosis(impl.diagnose(traces), want, f"simulated job {j}: {len(traces)} ranks, traces "
                        f"{json.dumps(sorted(traces, key=lambda d: d['rank']))[:700]}")


@pytest.mark.part("C")
@pytest.mark.points(1)
def test_diagnose_leaves_its_input_unchanged_and_returns_plain_values(impl, gen):
    traces = designed("stopped")
    before = copy.deepcopy(traces)
    out = impl.diagnose(traces)
    json.dumps(as_plain(out))
    if traces != before:
        raise AssertionError("diagnose modified its input traces (it must only read them)")


def invalid_cases():
    ok = designed("op")
    out = {"no traces": []}
    out["a rank twice"] = [ok[0], ok[0], ok[2], ok[3]]
    out["a rank missing"] = ok[:3]
    d = copy.deepcopy(ok)
    d[1]["world_size"] = 5
    out["different world sizes"] = d
    d = copy.deepcopy(ok)
    d[2]["entries"][0]["pg_ranks"] = [0, 1, 2]
    out["members differ"] = d
    d = copy.deepcopy(ok)
    d[3]["entries"].append(entry("x", [0, 1], 1))
    out["a rank on a group that excludes it"] = d
    d = copy.deepcopy(ok)
    d[0]["entries"][0]["state"] = "running"
    out["a state outside STATES"] = d
    d = copy.deepcopy(ok)
    d[1]["entries"].append(dict(d[1]["entries"][0]))
    out["(pg_name, seq) twice on a rank"] = d
    d = copy.deepcopy(ok)
    del d[2]["entries"][0]["output_dtypes"]
    out["an entry lacking output_dtypes"] = d
    return out


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_diagnose_refuses_invalid_traces(impl):
    for why, traces in invalid_cases().items():
        expect_raises(ValueError, f"diagnose must refuse invalid traces ({why})", impl.diagnose, traces)
