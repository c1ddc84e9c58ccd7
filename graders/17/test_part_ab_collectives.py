"""Hidden graders of lab 17, parts A and B: collectives beyond the ring (lab-contracts.md section 17).

Every case runs on W sandboxed gloo ranks (run_ranks). A body drives its rank: inputs are built
here from the seed and sent as tensors, each call runs under the communication counter with every
data collective forbidden, and the counter's report (messages, elements and bytes sent with each
message's peer, read at torch.distributed's functions and the dispatcher, for the whole worker) comes
back with the result. The grader computes the oracle in float64 (int64 for integers) and compares.

One run of the ranks per world size holds every test's job of that W (``runs_of``: hd_all_reduce's,
the trees', Part B's; Part B's hierarchies spread over more runs where their groups would be too
many), run at the first test that needs it with the first test's seed; each test grades its own
property on its own job's results. A job that raises on a rank is that job's result, and every
rank stops after it (the ranks agree after each job); a job that hangs or kills a rank is that
job's result too (each job's results are kept as it ends): the jobs after it run in a fresh run,
so a deviation costs only the tests of the jobs it breaks.

Each test grades one property on inputs where the others cannot matter: values on float32/float64/
integer sums and maxima; "avg" alone; float16/bfloat16 rounding alone on inputs whose float32 sum is
exact; views alone; identical bits alone; cost (messages, elements, bytes; tree fan-in, fan-out and
the height the logs allow) only after the values were checked on the same call.
"""
from __future__ import annotations

import math
import threading
from collections import Counter

import pytest
import torch

from harness.toolkit import DATA_COLLECTIVES, RankError, RankTimeout, SandboxError, View, assert_close, run_ranks

DT = {"fp32": torch.float32, "fp64": torch.float64, "fp16": torch.float16, "bf16": torch.bfloat16,
      "int32": torch.int32, "int64": torch.int64}
T = 30.0    # seconds per run (every job of one W and family): the reference needs a few; a deadlock fails here
TOL = {"fp32": (1e-5, 1e-5), "fp64": (1e-12, 1e-12)}


def ceil_div(a, b):
    return -(-a // b)


def log2p(W):
    return W.bit_length() - 1


# ----------------------------------------------------------------------------- inputs

def make_input(seed, rank, n, dtype, kind="randn"):
    """Rank ``rank``'s flat input of ``n`` elements. ``kind="exact"``: small integers whose float32
    sum over 8 ranks is exact and whose float16/bfloat16 partial sums are not (values up to 2^11)."""
    g = torch.Generator().manual_seed((seed * 16 + rank + 1) % 2**63)
    dt = DT[dtype]
    if kind == "exact":
        return torch.randint(-2047, 2048, (n,), generator=g, dtype=torch.int64).to(dt)
    if dt.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dt)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int64).to(dt)


def oracle(xs, op):
    acc = torch.float64 if xs[0].dtype.is_floating_point else torch.int64
    s = torch.stack([x.reshape(-1).to(acc) for x in xs])
    if op == "max":
        return s.max(0).values
    return s.sum(0) / len(xs) if op == "avg" else s.sum(0)


def bits(t):
    t = t.contiguous().reshape(-1)
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


P2P_OPS = {"send", "recv_", "recv_any_source_", "barrier"}   # dispatcher ops that are no data collective


def no_collective(comm, case):
    """No collective, however reached: the counter's functions and methods, or any collective dispatcher
    op (c10d's and the functional collectives', ``c10d`` events) but a barrier."""
    ops = {e.get("op") for e in comm.get("events", []) if e.get("k") == "c10d"} - P2P_OPS
    if comm["forbidden"] or comm["collectives"] or ops:
        names = sorted(set(comm["forbidden"]) | set(comm["collectives"]) | {str(o) for o in ops})
        raise AssertionError(f"called a collective ({', '.join(names)}) ({case}): the contract allows only "
                             "send/recv/isend/irecv/batch_isend_irecv")


def check_values(got, want, dtype, what, case):
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        raise AssertionError(f"{what} ({case}): got {getattr(got, 'shape', type(got).__name__)}, "
                             f"expected shape {tuple(want.shape)}")
    if dtype in TOL:
        atol, rtol = TOL[dtype]
        assert_close(got.double(), want, atol=atol, rtol=rtol, what=what, case=case)
    elif not torch.equal(got.to(torch.int64), want):
        bad = (got.to(torch.int64) != want).nonzero().reshape(-1)[:4].tolist()
        raise AssertionError(f"{what} ({case}): elements {bad} differ: got {got.reshape(-1)[bad].tolist()}, "
                             f"expected {want.reshape(-1)[bad].tolist()}")


# ----------------------------------------------------------------------------- rank bodies

def body_calls(rk, seed, fn_name, cases):
    """Each case ``(n, dtype, op, kind, extra)``: this rank's input, the call, the result and the report."""
    out = []
    for n, dtype, op, kind, extra in cases:
        x = make_input(seed, rk.rank, n, dtype, kind)
        rk.note(f"{fn_name} n={n} {dtype} {op}")
        kwargs = dict(extra)
        if op is not None:
            kwargs["op"] = op
        c = rk.call(getattr(rk.impl, fn_name), x, forbid_collectives=DATA_COLLECTIVES, **kwargs)
        no_collective(c.comm, f"{fn_name}, W={rk.world_size}, N={n}, rank {rk.rank}")
        out.append({"got": c.args[0], "same": c.same[0] and c.out is not None, "comm": c.comm})
    return out


# ============================================================================= Part A: hd_all_reduce

def hd_cases(W):
    """Sizes below, around and above W, each with one of the four dtype/op pairs (and a larger float32 sum)."""
    pairs = (("fp32", "sum"), ("fp64", "max"), ("int64", "sum"), ("int32", "max"))
    sizes = [1, max(W - 1, 1), W + 3, 7 * W + 5]
    return [(n, *pairs[i], "randn", {}) for i, n in enumerate(sizes)] + [(61, "fp32", "sum", "randn", {})]


@pytest.mark.part("A")
@pytest.mark.points(1)
@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 6, 7, 8], ids=lambda w: f"W{w}")
def test_hd_all_reduce_values(W, runs):
    """sum and max of float32/float64/int32/int64 on every rank, for N below, around and above W."""
    cases, seed = hd_cases(W), runs.seed
    res = runs("hd", W, "values")
    for i, (n, dtype, op, kind, _) in enumerate(cases):
        want = oracle([make_input(seed, r, n, dtype) for r in range(W)], op)
        for r in range(W):
            no_collective(res[r][i]["comm"], f"W={W}, N={n}")
            check_values(res[r][i]["got"], want, dtype, "wrong all-reduce result",
                         f"W={W}, N={n}, {dtype}, op={op}, rank {r}")


@pytest.mark.part("A")
@pytest.mark.points(1)
@pytest.mark.parametrize("W", [3, 4], ids=lambda w: f"W{w}")
def test_hd_all_reduce_avg_divides_once(W, runs):
    cases, seed = avg_cases(W), runs.seed
    res = runs("hd", W, "avg")
    for i, (n, dtype, op, kind, _) in enumerate(cases):
        xs = [make_input(seed, r, n, dtype) for r in range(W)]
        want = oracle(xs, "avg")
        for r in range(W):
            got = res[r][i]["got"].double()
            case = f"W={W}, N={n}, {dtype}, rank {r}"
            if torch.allclose(got, want * W, rtol=1e-5, atol=1e-5):
                raise AssertionError(f"op='avg' is the sum, never divided by the number of ranks ({case})")
            if torch.allclose(got, want / W, rtol=1e-5, atol=1e-5):
                raise AssertionError(f"op='avg' divided by the number of ranks twice ({case})")
            check_values(res[r][i]["got"], want, dtype, "op='avg' is not the mean over the ranks", case)


def check_rounded_once(res, seed, W, cases, what):
    """Each rank's float16/bfloat16 result equals the float32 reduction rounded once (avg: 1 ulp)."""
    for i, (n, dtype, op, kind, _) in enumerate(cases):
        xs = [make_input(seed, r, n, dtype, kind) for r in range(W)]
        f32 = oracle([x.float() for x in xs], op)   # exact: small integers
        want = f32.to(torch.float32).to(DT[dtype])
        for r in [r for r in range(W) if res[r][i] is not None]:
            got = res[r][i]["got"]
            case = f"W={W}, N={n}, {dtype}, op={op}, rank {r}"
            if op == "avg":
                ulp = (want.float().abs() * (2.0 ** -10 if dtype == "fp16" else 2.0 ** -7)).clamp_min(1e-6)
                ok = ((got.float() - want.float()).abs() <= ulp).all()
            else:
                ok = torch.equal(bits(got), bits(want))
            if not ok:
                bad = (got.float() != want.float()).nonzero().reshape(-1)[:3].tolist()
                raise AssertionError(f"{what}: {dtype} partial sums were rounded to {dtype} on the way (accumulate "
                                     f"in float32 and round once) ({case}): elements {bad} got "
                                     f"{got.float()[bad].tolist()}, the float32 sum rounded once is "
                                     f"{want.float()[bad].tolist()}")


@pytest.mark.part("A")
@pytest.mark.points(1)
@pytest.mark.parametrize("W", [3, 4], ids=lambda w: f"W{w}")
def test_hd_all_reduce_half_precision_rounds_once(W, runs):
    res = runs("hd", W, "half")
    check_rounded_once(res, runs.seed, W, half_cases(W), "hd_all_reduce")


def body_view(rk, seed, fn_name, rows, cols, extra):
    """A strided view (every other column of a wider buffer); storage outside it holds -7."""
    base = torch.full((rows, 2 * cols + 1), -7.0)
    view = base[:, 1::2]
    view.copy_(make_input(seed, rk.rank, rows * cols, "fp32").view(rows, cols))
    c = rk.call(getattr(rk.impl, fn_name), View(base, view), forbid_collectives=DATA_COLLECTIVES, **extra)
    no_collective(c.comm, f"{fn_name}, W={rk.world_size}, rank {rk.rank}")
    return {"base": c.args[0], "same": c.same[0]}


def check_view(res, seed, W, rows, cols, want_of, what):
    for r in range(W):
        base = res[r]["base"]
        case = f"W={W}, a ({rows}, {cols}) view of every other column of a ({rows}, {2 * cols + 1}) buffer, rank {r}"
        outside = torch.ones_like(base, dtype=torch.bool)
        outside[:, 1::2] = False
        if not torch.equal(base[outside], torch.full_like(base[outside], -7.0)):
            raise AssertionError(f"{what} wrote outside the caller's view ({case}): storage between the view's "
                                 "elements changed (write through the view: tensor.copy_(result.view(shape)))")
        want = want_of(r)
        if want is not None:
            assert_close(base[:, 1::2].double().reshape(-1), want, atol=1e-5, rtol=1e-5,
                         what=f"{what} did not write the result through the caller's view", case=case)
        if not res[r]["same"]:
            raise AssertionError(f"{what} must return its argument (the caller's view), not a new tensor ({case})")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_hd_all_reduce_writes_through_views(runs):
    (W, rows, cols), seed = VIEW, runs.seed
    res = runs("hd", W, "views")
    want = oracle([make_input(seed, r, rows * cols, "fp32") for r in range(W)], "sum")
    check_view(res, seed, W, rows, cols, lambda r: want, "hd_all_reduce")


@pytest.mark.part("A")
@pytest.mark.points(1)
@pytest.mark.parametrize("W", [5, 8], ids=lambda w: f"W{w}")
def test_hd_all_reduce_identical_bits_on_every_rank(W, runs):
    cases, seed = bits_cases(W), runs.seed
    res = runs("hd", W, "bits")
    for i, (n, dtype, op, _, _) in enumerate(cases):
        want = oracle([make_input(seed, r, n, dtype) for r in range(W)], op)
        for r in range(W):
            check_values(res[r][i]["got"], want, dtype, "wrong all-reduce result", f"W={W}, N={n}, rank {r}")
        for r in range(1, W):
            if not torch.equal(bits(res[r][i]["got"]), bits(res[0][i]["got"])):
                bad = (bits(res[r][i]["got"]) != bits(res[0][i]["got"])).nonzero().reshape(-1)[:3].tolist()
                raise AssertionError(f"ranks hold different bits (each rank reduced in its own order; reduce each "
                                     f"block once, then copy it) (W={W}, N={n}): rank {r} and rank 0 differ at "
                                     f"elements {bad}")


def body_errors(rk, seed, fn_name, calls):
    """Each call must raise; returns (exception name or None, messages sent) per call."""
    out = []
    for x, kwargs in calls:
        try:
            c = rk.call(getattr(rk.impl, fn_name), x, forbid_collectives=DATA_COLLECTIVES, **kwargs)
            out.append((None, c.comm["sent_msgs"], ""))
        except (TypeError, ValueError) as e:
            out.append((type(e).__name__, 0, str(e)))
    return out


def check_errors(res, calls, expected, fn_name):
    for i, (x, kwargs) in enumerate(calls):
        for r, rows in enumerate(res):
            name, msgs, text = rows[i]
            case = f"{fn_name}(tensor of {x.dtype}, {kwargs}), rank {r}"
            if name != expected[i][0]:
                raise AssertionError(f"wrong argument error: {case} must raise {expected[i][0]} on every rank, "
                                     f"before any message; got {name or 'nothing'} ({msgs} messages sent)")
            if expected[i][1] and expected[i][1] not in text:
                raise AssertionError(f"the error must name the offending value {expected[i][1]!r} ({case}): {text!r}")


@pytest.mark.part("A")
@pytest.mark.points(1)
def test_hd_all_reduce_argument_errors(runs):
    expected = [("TypeError", "uint8"), ("TypeError", "complex64"), ("TypeError", ""), ("ValueError", "prod")]
    res = runs("hd", 2, "errors")
    check_errors(res, hd_error_calls(), expected, "hd_all_reduce")


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [3, 4, 6, 8], ids=lambda w: f"W{w}")
def test_hd_all_reduce_messages_and_elements_per_rank(W, runs):
    """Per rank: <= 2 log2 p (+1 folded) messages, <= 2 (p-1) ceil(N/p) (+N folded) elements, each of
    at most max(itemsize, 4) bytes; N = 0 sends nothing."""
    cases, seed = cost_cases(W), runs.seed
    res = runs("hd", W, "cost")
    p = 1 << log2p(W)
    fold = W != p
    for i, (n, dtype, op, kind, _) in enumerate(cases):
        xs = [make_input(seed, r, n, dtype, kind) for r in range(W)]
        want = oracle([x.float() for x in xs], op).float().to(DT[dtype])   # exact sums rounded once
        msg_bound = 2 * log2p(W) + fold if n else 0
        elem_bound = 2 * (p - 1) * ceil_div(n, p) + (n if fold else 0)
        byte_bound = elem_bound * max(DT[dtype].itemsize, 4)
        for r in range(W):
            case = f"W={W}, p={p}, N={n}, {dtype}, rank {r}"
            check_values(res[r][i]["got"].double(), want.double(), "fp32", "wrong all-reduce result", case)
            comm = res[r][i]["comm"]
            no_collective(comm, case)
            if comm["sent_msgs"] > msg_bound:
                raise AssertionError(f"too many messages for recursive halving-doubling ({case}): rank {r} sent "
                                     f"{comm['sent_msgs']} messages, the bound is 2 log2 p"
                                     f"{' + 1 (the fold)' if fold else ''} = {msg_bound}")
            if comm["sent_elems"] > elem_bound:
                raise AssertionError(f"too many elements sent for Rabenseifner's all-reduce ({case}): rank {r} sent "
                                     f"{comm['sent_elems']} elements, the bound is 2 (p-1) ceil(N/p)"
                                     f"{' + N' if fold else ''} = {elem_bound} (halve the vector every round; "
                                     f"blocks that differ by at most one element)")
            if comm["sent_bytes"] > byte_bound:
                raise AssertionError(f"elements sent wider than max(itemsize, 4) bytes ({case}): rank {r} sent "
                                     f"{comm['sent_bytes']} bytes for a bound of {byte_bound}")


# ============================================================================= Part A: trees

def root_of(seed, W, salt):
    return (seed // 7 + salt) % W


def body_bcast(rk, seed, cases):
    out = []
    for n, dtype, src in cases:
        x = make_input(seed, rk.rank, n, dtype)
        c = rk.call(rk.impl.tree_broadcast, x, src=src, forbid_collectives=DATA_COLLECTIVES)
        no_collective(c.comm, f"tree_broadcast, W={rk.world_size}, N={n}, rank {rk.rank}")
        out.append({"got": c.args[0], "comm": c.comm})
    return out


def bcast_cases(seed, W):
    return [(n, dt, root_of(seed, W, k)) for k, (n, dt) in enumerate([(W + 2, "fp32"), (19, "bf16"), (1, "int32"),
                                                                       (2 * W + 1, "fp64"), (11, "int64")])]


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [3, 6], ids=lambda w: f"W{w}")
def test_tree_broadcast_values(W, runs):
    cases, seed = bcast_cases(runs.seed, W), runs.seed
    res = runs("tree", W, "bcast_values")
    for i, (n, dtype, src) in enumerate(cases):
        want = make_input(seed, src, n, dtype)
        for r in range(W):
            case = f"W={W}, N={n}, {dtype}, src={src}, rank {r}"
            no_collective(res[r][i]["comm"], case)
            got = res[r][i]["got"]
            if not torch.equal(bits(got), bits(want)):
                hint = (f" (it holds group rank {[q for q in range(W) if torch.equal(got, make_input(seed, q, n, dtype))]}"
                        "'s values)") if r != src else " (src's own tensor changed)"
                raise AssertionError(f"tree_broadcast: rank {r} does not hold src's tensor bitwise ({case}){hint}")


def body_reduce(rk, seed, cases):
    out = []
    for n, dtype, dst, op, kind in cases:
        x = make_input(seed, rk.rank, n, dtype, kind)
        c = rk.call(rk.impl.tree_reduce, x, dst=dst, op=op, forbid_collectives=DATA_COLLECTIVES)
        no_collective(c.comm, f"tree_reduce, W={rk.world_size}, N={n}, rank {rk.rank}")
        out.append({"got": c.args[0], "comm": c.comm})
    return out


def reduce_cases(seed, W):
    return [(n, dt, root_of(seed, W, k), op, "randn") for k, (n, dt, op) in enumerate(
        [(W + 2, "fp32", "sum"), (9, "fp64", "max"), (2 * W + 3, "int64", "sum"), (5, "int32", "max"),
         (13, "fp32", "avg")])]


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [3, 5], ids=lambda w: f"W{w}")
def test_tree_reduce_values(W, runs):
    cases, seed = reduce_cases(runs.seed, W), runs.seed
    res = runs("tree", W, "reduce_values")
    for i, (n, dtype, dst, op, kind) in enumerate(cases):
        xs = [make_input(seed, r, n, dtype, kind) for r in range(W)]
        case = f"W={W}, N={n}, {dtype}, op={op}, dst={dst}"
        no_collective(res[dst][i]["comm"], case)
        check_values(res[dst][i]["got"], oracle(xs, op), dtype, "tree_reduce: wrong result on dst", case)


@pytest.mark.part("A")
@pytest.mark.points(1)
@pytest.mark.parametrize("W", [4], ids=lambda w: f"W{w}")
def test_tree_reduce_leaves_other_ranks_unchanged(W, runs):
    cases, seed = reduce_cases(runs.seed, W)[:2], runs.seed
    res = runs("tree", W, "reduce_unchanged")
    for i, (n, dtype, dst, op, kind) in enumerate(cases):
        xs = [make_input(seed, r, n, dtype, kind) for r in range(W)]
        check_values(res[dst][i]["got"], oracle(xs, op), dtype, "tree_reduce: wrong result on dst", f"W={W}")
        for r in range(W):
            if r != dst and not torch.equal(bits(res[r][i]["got"]), bits(xs[r])):
                raise AssertionError(f"tree_reduce changed a non-dst rank's tensor (keep partial results in a "
                                     f"scratch buffer; gloo's reduce leaves them there, pytorch/pytorch #76527) "
                                     f"(W={W}, N={n}, {dtype}, dst={dst}, rank {r})")


@pytest.mark.part("A")
@pytest.mark.points(1)
def test_tree_reduce_half_precision_rounds_once(runs):
    W, cases = 5, reduce_half_cases()
    res = runs("tree", W, "reduce_half")
    only_dst = [[res[r][i] if r == 3 else None for i in range(len(cases))] for r in range(W)]
    check_rounded_once(only_dst, runs.seed, W, [(n, dt, op, kind, {}) for n, dt, dst, op, kind in cases],
                       "tree_reduce")


def body_root_errors(rk, seed):
    W, out = rk.world_size, []
    for fn, kw in (("tree_broadcast", {"src": 1.0}), ("tree_broadcast", {"src": W}), ("tree_reduce", {"dst": "0"}),
                   ("tree_reduce", {"dst": -1})):
        try:
            getattr(rk.impl, fn)(torch.zeros(2), **kw)
            out.append(None)
        except (TypeError, ValueError) as e:
            out.append([type(e).__name__, str(e)])
    return out


@pytest.mark.part("A")
@pytest.mark.points(1)
def test_tree_root_errors(runs):
    W = 3
    res = runs("tree", W, "root_errors")
    expected = [("tree_broadcast(src=1.0)", "TypeError", None), (f"tree_broadcast(src={W})", "ValueError", str(W)),
                ("tree_reduce(dst='0')", "TypeError", None), ("tree_reduce(dst=-1)", "ValueError", "-1")]
    for r in range(W):
        for got, (case, name, text) in zip(res[r], expected):
            if got is None or got[0] != name:
                raise AssertionError(f"wrong root error: {case} must raise {name} on every rank (W={W}, rank {r}); "
                                     f"got {got[0] if got else 'nothing'}")
            if text and text not in got[1]:
                raise AssertionError(f"the root error must name the value ({case}): {got[1]!r}")


def message_pairs(comms, case):
    """Elements sent per ordered pair (a, b) of global ranks, from every rank's log (``send``/``recv``
    events, each with its peer: the stand-ins read it in the rank's process). Cross-checked: every
    message names its peer, and what a logged sending to b is what b logged receiving from a."""
    sent, got = Counter(), Counter()
    for r, c in enumerate(comms):
        for e in (c or {}).get("events", []):
            if e.get("k") not in ("send", "recv"):
                continue
            peer = e.get("peer")
            if not isinstance(peer, int) or not 0 <= peer < len(comms) or peer == r or comms[peer] is None:
                raise AssertionError(f"a message without a known peer ({case}): rank {r} logged a {e['k']} with peer "
                                     f"{peer!r} (name the peer of every send and receive)")
            if e["k"] == "send":
                sent[(r, peer)] += e.get("numel", 0)
            else:
                got[(peer, r)] += e.get("numel", 0)
    if sent != got:
        bad = sorted(p for p in set(sent) | set(got) if sent[p] != got[p])[:3]
        raise AssertionError(f"the ranks' message logs disagree ({case}): "
                             + "; ".join(f"rank {a} logged {sent[(a, b)]} elements sent to rank {b}, rank {b} "
                                         f"logged {got[(a, b)]} received from rank {a}" for a, b in bad)
                             + " (every message must go through torch.distributed's send/recv/isend/irecv)")
    return sent


def min_height(children: list, root: int) -> int:
    """The least height any tree with these child counts and this root can have: the ranks with
    the most children placed nearest the root (a tree the logs allow; chains and flat trees fail)."""
    order = sorted((c for r, c in enumerate(children) if r != root), reverse=True)
    level, height, slots, i = [children[root]], 0, children[root], 0
    while i < len(order):
        if slots == 0:
            return 10**6  # disconnected: more ranks than the counts can reach
        height += 1
        take = order[i:i + slots]
        i += slots
        slots = sum(take)
    return height


def check_tree(W, root, n, comm, fan, single, what, case):
    """``fan``: the per-rank count of child messages ('sent_msgs' for broadcast, 'recv_msgs' for reduce)."""
    bound = math.ceil(math.log2(W)) if W > 1 else 0
    for r in range(W):
        c = comm[r]
        no_collective(c, case)
        one = c[single]
        if one != (0 if r == root else 1):
            raise AssertionError(f"{what}: every rank but the root must {'receive' if single == 'recv_msgs' else 'send'}"
                                 f" exactly one message and the root none ({case}): rank {r} (root {root}) has {one}")
        if c[fan] > bound:
            raise AssertionError(f"{what}: fan-out/fan-in above ceil(log2 W) = {bound} (a flat tree?) ({case}): rank "
                                 f"{r} has {c[fan]} child messages")
    h = min_height([comm[r][fan] for r in range(W)], root)
    if h > bound:
        raise AssertionError(f"{what}: tree too tall (a chain?) ({case}): with these child counts "
                             f"{[comm[r][fan] for r in range(W)]} no tree is shorter than {h} hops; the bound is "
                             f"ceil(log2 W) = {bound} (a binomial tree: parent of v is v - lowbit(v))")
    pairs = message_pairs(comm, case)
    up = "recv" if single == "recv_msgs" else "send"   # a rank's one message to / from its parent
    parent = {r: next(e["peer"] for e in comm[r]["events"] if e.get("k") == up) for r in range(W) if r != root}
    if any(pairs[(parent[r], r) if up == "recv" else (r, parent[r])] != n for r in parent):
        raise AssertionError(f"{what}: every message between a rank and its parent must carry the N elements ({case}):"
                             f" elements per pair {dict(pairs)}")
    depth = {root: 0}
    for r in range(W):
        path = [r]
        while path[-1] not in depth and len(path) <= W:
            path.append(parent[path[-1]])
        if path[-1] not in depth:
            raise AssertionError(f"{what}: the messages do not form a tree rooted at {root} ({case}): following each "
                                 f"rank's parent from rank {r} gives {path[:W]} (parents {parent})")
        for i, q in enumerate(reversed(path[:-1])):
            depth[q] = depth[path[-1]] + i + 1
    deepest = max(depth, key=depth.get)
    if depth[deepest] > bound:
        path = [deepest]
        while path[-1] != root:
            path.append(parent[path[-1]])
        raise AssertionError(f"{what}: tree too tall (a chain?) ({case}): the parents the messages show ({parent}) "
                             f"give rank {deepest} a path of {depth[deepest]} hops to the root ({' -> '.join(map(str, path))}"
                             f"); the bound is ceil(log2 W) = {bound} (a binomial tree: parent of v is v - lowbit(v))")


@pytest.mark.part("A")
@pytest.mark.points(1)
@pytest.mark.parametrize("W", [5, 8], ids=lambda w: f"W{w}")
def test_tree_broadcast_fan_out_and_height(W, runs):
    cases, seed = bcast_tree_cases(runs.seed, W), runs.seed
    res = runs("tree", W, "bcast_tree")
    for i, (n, dtype, src) in enumerate(cases):
        want = make_input(seed, src, n, dtype)
        case = f"W={W}, N={n}, {dtype}, src={src}"
        for r in range(W):
            if not torch.equal(bits(res[r][i]["got"]), bits(want)):
                raise AssertionError(f"tree_broadcast: rank {r} does not hold src's tensor bitwise ({case})")
        comm = [res[r][i]["comm"] for r in range(W)]
        for r in range(W):
            if r != src and comm[r]["recv_bytes"] != n * DT[dtype].itemsize:
                raise AssertionError(f"tree_broadcast: rank {r}'s one message must carry the N elements ({case}): "
                                     f"received {comm[r]['recv_bytes']} bytes")
        check_tree(W, src, n, comm, "sent_msgs", "recv_msgs", "tree_broadcast", case)


@pytest.mark.part("A")
@pytest.mark.points(1)
@pytest.mark.parametrize("W", [6, 8], ids=lambda w: f"W{w}")
def test_tree_reduce_fan_in_and_height(W, runs):
    cases, seed = reduce_tree_cases(runs.seed, W), runs.seed
    res = runs("tree", W, "reduce_tree")
    for i, (n, dtype, dst, op, kind) in enumerate(cases):
        xs = [make_input(seed, r, n, dtype, kind) for r in range(W)]
        case = f"W={W}, N={n}, {dtype}, dst={dst}"
        check_values(res[dst][i]["got"], oracle(xs, op), dtype, "tree_reduce: wrong result on dst", case)
        comm = [res[r][i]["comm"] for r in range(W)]
        for r in range(W):
            if r != dst and comm[r]["sent_elems"] != n:
                raise AssertionError(f"tree_reduce: rank {r}'s one message must carry the N elements ({case}): sent "
                                     f"{comm[r]['sent_elems']}")
        check_tree(W, dst, n, comm, "recv_msgs", "sent_msgs", "tree_reduce", case)


# ============================================================================= Part B: the hierarchy

def size_and_rank(group):
    """[size, this rank's rank] of a ProcessGroup handle, or a note where it is not one of this rank's groups."""
    try:
        return [group.size(), group.rank()]
    except Exception as e:  # noqa: BLE001 - e.g. GroupMember.NON_GROUP_MEMBER: the rank is not in it
        return f"not a group of this rank ({type(e).__name__})"


def body_hier(rk, seed, specs, cases, hierarchies):
    """For each (L, ranks): make_hierarchy (once per run: ``hierarchies``), its attributes, then
    hierarchical_all_reduce on each case."""
    out = []
    for L, ranks in specs:
        key = (L, None if ranks is None else tuple(ranks))
        if key not in hierarchies:
            hierarchies[key] = rk.call(rk.impl.make_hierarchy, L, ranks, forbid_collectives=DATA_COLLECTIVES).out
        h = hierarchies[key]
        if h is None:
            out.append(None)
            continue
        attrs = {k: getattr(h, k) for k in ("ranks", "local_size", "num_nodes", "rank", "node", "local_rank")}
        attrs["intra"] = size_and_rank(h.intra_group)
        attrs["inter"] = size_and_rank(h.inter_group)
        got = []
        for n, dtype, op, kind in cases:
            x = make_input(seed, rk.rank, n, dtype, kind)
            c = rk.call(rk.impl.hierarchical_all_reduce, x, h, op=op, forbid_collectives=DATA_COLLECTIVES)
            no_collective(c.comm, f"hierarchical_all_reduce, W={rk.world_size}, L={L}, N={n}, rank {rk.rank}")
            got.append({"got": c.args[0], "comm": c.comm, "same": c.same[0]})
        out.append({"attrs": attrs, "got": got})
    return out


def divisors(W):
    return [L for L in range(1, W + 1) if W % L == 0]


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_make_hierarchy_attributes(runs):
    W, specs = 6, ATTR_SPECS
    res = runs("hier", W, "attributes")
    for k, (L, ranks) in enumerate(specs):
        members = list(range(W)) if ranks is None else ranks
        for g in range(W):
            got = res[g][k]
            case = f"make_hierarchy({L}, {ranks}) on global rank {g}"
            if g not in members:
                if got is not None:
                    raise AssertionError(f"a rank outside ranks must get None ({case})")
                continue
            if got is None:
                raise AssertionError(f"a member got None ({case})")
            i = members.index(g)
            n = len(members) // L
            want = {"ranks": tuple(members), "local_size": L, "num_nodes": n, "rank": i, "node": i // L,
                    "local_rank": i % L, "intra": [L, i % L], "inter": [n, i // L]}
            a = dict(got["attrs"])
            a["ranks"] = tuple(a["ranks"])
            for key, value in want.items():
                if a[key] != value:
                    raise AssertionError(f"wrong Hierarchy.{key if key not in ('intra', 'inter') else key + '_group'}"
                                         f" ({case}): got {a[key]}, expected {value} (size, rank in group)")


def body_hier_errors(rk, seed, calls):
    out = []
    for args in calls:
        try:
            rk.impl.make_hierarchy(*args)
            out.append(None)
        except (TypeError, ValueError) as e:
            out.append([type(e).__name__, str(e)])
    return out


@pytest.mark.part("B")
@pytest.mark.points(1)
def test_make_hierarchy_argument_errors(runs):
    calls = HIER_ERROR_CALLS
    expected = ["TypeError", "ValueError", "ValueError", "ValueError", "ValueError"]
    res = runs("hier", 4, "errors")
    for r in range(4):
        for got, args, name in zip(res[r], calls, expected):
            if got is None or got[0] != name:
                raise AssertionError(f"wrong argument error: make_hierarchy{args} must raise {name} on every rank "
                                     f"before any group is made (W=4, rank {r}); got {got[0] if got else 'nothing'}")


def hier_check(res, seed, W, specs, cases, what_extra=None):
    for k, (L, ranks) in enumerate(specs):
        members = list(range(W)) if ranks is None else ranks
        Wh = len(members)
        for i, (n, dtype, op, kind) in enumerate(cases):
            want = oracle([make_input(seed, g, n, dtype, kind) for g in members], op)
            if kind == "exact":
                want = want.float().to(DT[dtype])   # exact sums rounded once
            for g in members:
                item = res[g][k]["got"][i]
                case = f"W={Wh}, L={L}, ranks={members}, N={n}, {dtype}, op={op}, global rank {g}"
                no_collective(item["comm"], case)
                check_values(item["got"], want, dtype, "wrong hierarchical all-reduce result", case)
                if what_extra:
                    what_extra(item, L, Wh, n, dtype, case, res, members, k, i)


@pytest.mark.part("B")
@pytest.mark.points(1)
@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 6, 7, 8], ids=lambda w: f"W{w}")
def test_hierarchical_all_reduce_values_for_every_local_size(W, runs):
    for L in divisors(W):
        res = runs("hier", W, f"values_L{L}")
        hier_check(res, runs.seed, W, [(L, None)], hier_values_cases(W))


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_hierarchical_all_reduce_on_a_subset_of_ranks(runs):
    W = 7
    for L in (2, 3):
        res = runs("hier", W, f"subset_L{L}")
        hier_check(res, runs.seed, W, [(L, list(range(1, W)))], SUBSET_CASES)


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_hierarchical_all_reduce_avg_and_half_precision(runs):
    W, cases = 6, HIER_HALF_CASES
    res = runs("hier", W, "avg_half")
    flat = [[res[r][0]["got"][i] for i in range(len(cases))] for r in range(W)]
    check_rounded_once(flat, runs.seed, W, [(n, dt, op, kind, {}) for n, dt, op, kind in cases],
                       "hierarchical_all_reduce")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_hierarchical_all_reduce_identical_bits_and_views(runs):
    W, specs, cases = 6, [(2, None)], HIER_BITS_CASES
    res = runs("hier", W, "bits")
    hier_check(res, runs.seed, W, specs, cases)
    for i, (n, *_) in enumerate(cases):
        for r in range(W):
            if not res[r][0]["got"][i]["same"]:
                raise AssertionError(f"hierarchical_all_reduce must return its argument, written in place (W={W}, "
                                     f"L=2, N={n}, rank {r})")
            if not torch.equal(bits(res[r][0]["got"][i]["got"]), bits(res[0][0]["got"][i]["got"])):
                raise AssertionError(f"ranks hold different bits (each rank reduced in its own order; reduce each "
                                     f"chunk once, then copy it) (W={W}, L=2, N={n}): rank {r} and rank 0 differ")


@pytest.mark.part("B")
@pytest.mark.points(1)
@pytest.mark.parametrize("W,L", [(6, 3), (8, 2), (8, 4)], ids=lambda v: str(v))
def test_hierarchical_all_reduce_elements_per_rank(W, L, runs):
    """Per rank: <= 2 (L-1) ceil(N/L) + 2 (n-1) ceil(ceil(N/L)/n) elements, each of at most
    max(itemsize, 4) bytes (a flat ring over W, or leaders that broadcast, send more)."""
    specs, cases, seed = [(L, None)], hier_cost_cases(W), runs.seed
    res = runs("hier", W, f"cost_L{L}")

    def bound(item, L, Wh, n, dtype, case, res, members, k, i):
        nn = Wh // L
        c = ceil_div(n, L)
        elems = 2 * (L - 1) * c + 2 * (nn - 1) * ceil_div(c, nn)
        comm = item["comm"]
        pairs = message_pairs([res[g][k]["got"][i]["comm"] if g in members else None for g in range(W)], case)
        me = next(m for m in members if res[m][k]["got"][i] is item)
        node = lambda q: members.index(q) // L
        inter = sum(v for (a, b), v in pairs.items() if a == me and node(b) != node(me))
        inter_bound = 2 * (nn - 1) * ceil_div(c, nn)
        if inter > inter_bound:
            raise AssertionError(f"too many elements sent to other nodes for the hierarchical all-reduce ({case}): "
                                 f"sent {inter} to ranks on other nodes (node = hierarchy rank // L), the bound is "
                                 f"2 (n-1) ceil(ceil(N/L)/n) = {inter_bound} (only this rank's chunk of ceil(N/L) "
                                 f"crosses nodes, all-reduced among the same local rank of every node)")
        if comm["sent_elems"] > elems:
            raise AssertionError(f"too many elements sent for the hierarchical all-reduce ({case}): sent "
                                 f"{comm['sent_elems']}, the bound is 2 (L-1) ceil(N/L) + 2 (n-1) ceil(ceil(N/L)/n) = "
                                 f"{elems} (reduce-scatter in the node, all-reduce of one chunk across nodes, "
                                 f"all-gather in the node)")
        if comm["sent_bytes"] > elems * max(DT[dtype].itemsize, 4):
            raise AssertionError(f"elements sent wider than max(itemsize, 4) bytes ({case}): {comm['sent_bytes']} bytes")
    hier_check(res, seed, W, specs, cases, bound)


# ============================================================================= the runs: one per W and family

def avg_cases(W):
    return [(n, dt, "avg", "randn", {}) for n in (W + 2, 23) for dt in ("fp32", "fp64")]


def half_cases(W):
    return [(n, dt, op, "exact", {}) for n in (W + 1, 37) for dt in ("fp16", "bf16") for op in ("sum", "avg")]


def bits_cases(W):
    return [(n, "fp32", "sum", "randn", {}) for n in (4 * W + 3, 97)]


def cost_cases(W):
    sizes = [8 * W + 5, 8 * 13 + 5, 0]
    return [(n, "fp32", "sum", "randn", {}) for n in sizes] + [(8 * W + 5, "fp16", "sum", "exact", {})]


def hd_error_calls():
    return [(torch.zeros(3, dtype=torch.uint8), {}), (torch.zeros(3, dtype=torch.complex64), {}),
            (torch.zeros(3, dtype=torch.int32), {"op": "avg"}), (torch.zeros(3), {"op": "prod"})]


VIEW = (3, 5, 3)   # W, rows, cols


def reduce_half_cases():
    return [(n, dt, 3, op, "exact") for n in (7, 30) for dt in ("fp16", "bf16") for op in ("sum", "avg")]


def bcast_tree_cases(seed, W):
    return [(3 * W + 1, "fp32", root_of(seed, W, 3)), (10, "fp16", root_of(seed, W, 4))]


def reduce_tree_cases(seed, W):
    return [(2 * W + 3, "fp32", root_of(seed, W, 5), "sum", "randn")]


def hier_values_cases(W):
    return [(1, "int64", "max", "randn"), (W + 2, "fp32", "sum", "randn"), (29, "fp64", "sum", "randn")]


def hier_cost_cases(W):
    return [(n, dt, "sum", "exact") for n, dt in ((12 * W + 5, "fp32"), (7 * W + 3, "fp16"))]


ATTR_SPECS = [(3, None), (2, [1, 2, 3, 4]), (1, [0, 2, 5])]
HIER_ERROR_CALLS = [(2.0, None), (0, None), (3, None), (2, [2, 1]), (1, [0, 0])]
SUBSET_CASES = [(n, "fp32", "sum", "randn") for n in (5, 17)]
HIER_HALF_CASES = [(n, dt, op, "exact") for n in (5, 22) for dt in ("fp16", "bf16") for op in ("sum", "avg")]
HIER_BITS_CASES = [(n, "fp32", "sum", "randn") for n in (7, 41)]


def jobs_of(family, W, seed):
    """The jobs ``(name, body, arguments)`` of one run: every test's cases of this W and family."""
    hd = "hd_all_reduce"
    if family == "hd":
        jobs = [("values", "calls", (hd, hd_cases(W)))]
        jobs += [("avg", "calls", (hd, avg_cases(W))), ("half", "calls", (hd, half_cases(W)))] if W in (3, 4) else []
        jobs += [("views", "view", (hd, *VIEW[1:], {}))] if W == VIEW[0] else []
        jobs += [("bits", "calls", (hd, bits_cases(W)))] if W in (5, 8) else []
        jobs += [("errors", "errors", (hd, hd_error_calls()))] if W == 2 else []
        jobs += [("cost", "calls", (hd, cost_cases(W)))] if W in (3, 4, 6, 8) else []
        return jobs
    if family == "tree":
        jobs = [("bcast_values", "bcast", (bcast_cases(seed, W),))] if W in (3, 6) else []
        jobs += [("reduce_values", "reduce", (reduce_cases(seed, W),))] if W in (3, 5) else []
        jobs += [("reduce_unchanged", "reduce", (reduce_cases(seed, W)[:2],))] if W == 4 else []
        jobs += [("reduce_half", "reduce", (reduce_half_cases(),))] if W == 5 else []
        jobs += [("root_errors", "root_errors", ())] if W == 3 else []
        jobs += [("bcast_tree", "bcast", (bcast_tree_cases(seed, W),))] if W in (5, 8) else []
        jobs += [("reduce_tree", "reduce", (reduce_tree_cases(seed, W),))] if W in (6, 8) else []
        return jobs
    jobs = [(f"values_L{L}", "hier", ([(L, None)], hier_values_cases(W))) for L in divisors(W)]
    jobs += [(f"subset_L{L}", "hier", ([(L, list(range(1, W)))], SUBSET_CASES)) for L in (2, 3)] if W == 7 else []
    jobs += [("attributes", "hier", (ATTR_SPECS, [])), ("avg_half", "hier", ([(3, None)], HIER_HALF_CASES)),
             ("bits", "hier", ([(2, None)], HIER_BITS_CASES))] if W == 6 else []
    jobs += [(f"cost_L{L}", "hier", ([(L, None)], hier_cost_cases(W))) for L in {6: (3,), 8: (2, 4)}.get(W, ())]
    jobs += [("errors", "hier_errors", (HIER_ERROR_CALLS,))] if W == 4 else []
    return jobs


GROUPS_PER_RUN = 13  # gloo groups one run of Part B may create (each holds threads in every rank until the run ends)


def runs_of(W, seed):
    """Every job of world size W (``jobs_of`` of each family, named ``family:name``) split into runs:
    each job goes into the first run where the hierarchies (the jobs on the same (L, ranks) share one)
    make at most ``GROUPS_PER_RUN`` groups (a run holding every L of W=8 runs out of threads); the
    jobs that make no group (hd_all_reduce, the trees) all go into the first."""
    runs = []   # [jobs, the (L, ranks) of their hierarchies]
    for family in ("hd", "tree", "hier"):
        for name, kind, args in jobs_of(family, W, seed):
            mine = {(L, None if r is None else tuple(r)) for L, r in args[0]} if kind == "hier" else set()
            fits = [run for run in runs if sum(len(r or range(W)) // L + L for L, r in run[1] | mine) <= GROUPS_PER_RUN]
            if not fits:
                runs.append([[], set()])
                fits = [runs[-1]]
            fits[0][0].append((f"{family}:{name}", kind, args))
            fits[0][1].update(mine)
    return [run[0] for run in runs]


BODIES = {"calls": body_calls, "view": body_view, "errors": body_errors, "bcast": body_bcast, "reduce": body_reduce,
          "root_errors": body_root_errors, "hier": body_hier, "hier_errors": body_hier_errors}


class Agree:
    """The ranks' threads (in this trusted process) agreeing after each job: when it raised on some
    rank, every rank stops the run there (the next job's messages would not match)."""

    def __init__(self, parties):
        self.parties, self.cond, self.votes = parties, threading.Condition(), {}

    def __call__(self, name, ok):
        with self.cond:
            votes = self.votes.setdefault(name, [])
            votes.append(ok)
            self.cond.notify_all()
            self.cond.wait_for(lambda: len(votes) >= self.parties or not all(votes), timeout=T)
            return len(votes) >= self.parties and all(votes)


def body_run(rk, seed, jobs, agree, log):
    """The jobs in order, one process group; each job's result goes into ``log[rank][name]`` as it
    ends. A job that raises on this rank is recorded (``{"error": ...}``) and, like a job that
    raised on another rank, ends the run."""
    hierarchies = {}
    for name, kind, args in jobs:
        rk.note(f"job {name}")
        ok = True
        try:
            extra = (hierarchies,) if kind == "hier" else ()
            log[rk.rank][name] = BODIES[kind](rk, seed, *args, *extra)
        except SandboxError:
            raise
        except Exception as e:  # noqa: BLE001 - graded by the test of that job
            log[rk.rank][name], ok = {"error": f"rank {rk.rank} of {rk.world_size} raised {type(e).__name__}: {e}"
                                      [-3000:]}, False
        if not agree(name, ok):
            break


def run_jobs(impl, seed, W, jobs):
    """Per rank, job name -> result. The jobs after one that raised run again in a fresh run; a
    run that fails as a whole (a deadlock, a rank that died) is the result of the job it was in
    (the jobs every rank had ended keep their results, the ones after it run again), so a hang
    costs its own job only; once the grading's budget of hangs is spent (``SandboxError``: not
    run), the jobs left carry that error, which their tests raise."""
    out = [{} for _ in range(W)]
    while jobs:
        log = {r: {} for r in range(W)}
        failure = None
        try:
            run_ranks(body_run, W, seed, jobs, Agree(W), log, impl=impl, timeout=T)
        except (RankError, RankTimeout) as e:
            failure = str(e)
        except SandboxError as e:  # the grading's budget of hangs is spent: each test left says so itself
            for r in range(W):
                out[r].update({name: {"raise": e} for name, _, _ in jobs})
            return out
        ran = 0
        while ran < len(jobs) and all(jobs[ran][0] in log[r] for r in range(W)):
            ran += 1
        for r in range(W):
            out[r].update({name: log[r][name] for name, _, _ in jobs[:ran]})
        if failure is not None and ran < len(jobs):
            name = jobs[ran][0]
            raised = [log[r][name] for r in range(W) if isinstance(log[r].get(name), dict) and "error" in log[r][name]]
            for r in range(W):
                out[r][name] = raised[0] if raised else {"error": failure}
            ran += 1
        jobs = jobs[max(1, ran):]
    return out


@pytest.fixture(scope="module")
def run_store():
    return {}


class Runs:
    """``runs(family, W, name)``: the W results (rank order) of job ``name``, its run made at the
    first test that needs it (``runs.seed``: the seed of every run of this module)."""

    def __init__(self, store, impl, seed):
        self.store, self.impl = store, impl
        self.seed = store.setdefault("seed", seed)

    def __call__(self, family, W, name):
        name = f"{family}:{name}"
        jobs = next(run for run in runs_of(W, self.seed) if name in [job[0] for job in run])
        key = (W, jobs[0][0])
        if key not in self.store:
            self.store[key] = run_jobs(self.impl, self.seed, W, jobs)
        outs = [rank[name] for rank in self.store[key]]
        for o in outs:
            if isinstance(o, dict) and "raise" in o:
                raise o["raise"]
            if isinstance(o, dict) and "error" in o:
                raise AssertionError(o["error"])
        return outs


@pytest.fixture
def runs(run_store, impl, seed):
    return Runs(run_store, impl, seed)
