"""Hidden graders of lab 07, data parallelism from scratch (the DDP contract).

Each case builds the trusted model (``TrainNet``: linear layers, tanh between, a
``scale`` buffer) on W spawned gloo ranks, wraps it in the submission's ``DDP`` and runs
training steps there (``rk.backward``: forward, backward with the grader's
``grad_output``, plain SGD on the model). Every training case starts the ranks from the
same weights (rank 0's), so a missing or wrong construction broadcast costs the broadcast
test only; that test alone starts each rank from its own weights and buffer. Rank r's
loss is ``sum(out_r * g_r)`` with ``g_r`` the mean-over-batch gradient, so the average
over the ranks is the loss of the concatenated batch. The parent replays every step in
float64 from rank 0's initial weights (its own functional forward, not the model) and
compares gradients after each backward and parameters after each step (float32 and
float64 layers: atol 1e-6, rtol 0).

The communication counter records, in order, each gradient's ``ready`` event (a
post-accumulate-grad hook of the model, registered before the DDP's own), every
collective launch (op, elements, dtype, async) and every ``Work.wait``; the overlap
and once-per-bucket checks read that log. A failure names the bug class it matches
(sum instead of average, buckets in forward order, all-reduce after backward, ...).
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.toolkit import (RankError, RankTimeout, against_twin, assert_close, imported_names, is_instance, run_ranks,
                             source, timed, train_net)

T = 60.0
T_HANG = 25.0  # the unused-parameter cases: an honest run takes ~1 s; a DDP that never launches a bucket hangs
ATOL = 1e-6
RTOL = 1e-5  # float32 gradients ~1: another (correct) summation order moved one element by 1.8e-6 relative
LR = 0.25
FORBID = ["torch.nn.parallel.DistributedDataParallel", "torch.distributed.Reducer"]
FORBIDDEN_MODULES = ("torch.distributed.algorithms", "torch.distributed._composable", "torch.distributed.fsdp",
                     "torch.nn.parallel.distributed")


# ----------------------------------------------------------------------------- scenario

def layer(name, d_in, d_out, bias=True, dtype="float32", frozen=False):
    return {"name": name, "in": d_in, "out": d_out, "bias": bias, "dtype": dtype, "frozen": frozen}


MLP = {"layers": [layer("inp", 5, 8), layer("mid", 8, 8), layer("out", 8, 3)]}
# square layers "b", "c" can be skipped (unused parameters); "f" is frozen; "d" is float64
WIDE = {"layers": [layer("a", 6, 8), layer("b", 8, 8), layer("c", 8, 8, bias=False), layer("d", 8, 8, dtype="float64"),
                   layer("f", 8, 8, frozen=True), layer("e", 8, 4)]}


def trainable(spec):
    """(name, shape, dtype) of every trainable parameter in ``module.parameters()`` order."""
    out = []
    for L in spec["layers"]:
        if L["frozen"]:
            continue
        dt = getattr(torch, L["dtype"])
        out.append((f"layers.{L['name']}.weight", (L["out"], L["in"]), dt))
        if L["bias"]:
            out.append((f"layers.{L['name']}.bias", (L["out"],), dt))
    return out


def init_state(seed, spec, rank):
    """Rank ``rank``'s own initial state dict: weights and ``scale`` buffer (the broadcast
    test starts each rank from its own; every other case starts all ranks from rank 0's)."""
    g = torch.Generator().manual_seed((seed * 31 + rank * 7 + 1) % 2**63)
    state = {}
    for L in spec["layers"]:
        dt = getattr(torch, L["dtype"])
        state[f"layers.{L['name']}.weight"] = (torch.randn(L["out"], L["in"], generator=g) / math.sqrt(L["in"])).to(dt)
        if L["bias"]:
            state[f"layers.{L['name']}.bias"] = (torch.randn(L["out"], generator=g) * 0.1).to(dt)
    state["scale"] = 1 + 0.25 * torch.rand(spec["layers"][-1]["out"], generator=g)
    return state


def batch(seed, rank, step, spec, B=3):
    """Rank ``rank``'s input ``(B, in)`` and ``grad_output`` ``(B, out)`` (a mean over its batch)."""
    g = torch.Generator().manual_seed((seed * 131 + rank * 17 + step * 5 + 2) % 2**63)
    x = torch.randn(B, spec["layers"][0]["in"], generator=g)
    go = torch.randn(B, spec["layers"][-1]["out"], generator=g) / B
    return x, go


def expected_buckets(spec, cap_mb):
    """The contract's partition, built here from the rule (never from the submission)."""
    buckets, size, key = [], 0, None
    for name, shape, dt in reversed(trainable(spec)):
        nbytes = math.prod(shape) * torch.empty((), dtype=dt).element_size()
        if buckets and dt == key and size + nbytes <= cap_mb * 2**20:
            buckets[-1].append(name)
            size += nbytes
        else:
            buckets.append([name])
            size, key = nbytes, dt
    return buckets


def body_train(rk, seed, spec, cap, plan, groups=None, own_start=False):
    """Drives one rank: builds the model from rank 0's state (``own_start``: from this
    rank's own, for the broadcast test), wraps it (under the counter; in this rank's group
    of ``groups`` if given), then one backward per entry of ``plan`` (``{"no_sync": bool,
    "skip": {rank: [layer names]}}``); SGD after every synchronised backward."""
    model = rk.build_model(spec, init_state(seed, spec, rk.rank if own_start else 0))
    group = None
    if groups is not None:
        group = next(g for g in rk.new_groups(groups) if g is not None)
    c = rk.call(rk.impl.DDP, model, bucket_cap_mb=cap, group=group, forbid=FORBID)
    ddp = c.out
    out = {"construct": c.comm["collectives"], "buckets": ddp.buckets, "torch_ddp": is_instance(
        ddp, torch.nn.parallel.DistributedDataParallel), "wraps": rk.wraps(ddp, model), "state0": rk.state(model),
        "steps": []}
    for step, p in enumerate(plan):
        x, go = batch(seed, rk.rank, step, spec)
        skip = p.get("skip", {}).get(rk.rank, [])
        s = rk.backward(ddp, model, x, grad_output=go, skip=skip, no_sync=p.get("no_sync", False),
                        lr=None if p.get("no_sync") else LR, forbid=FORBID)
        out["steps"].append({"grads": s.grads, "params": s.params, "comm": s.comm, "events": s.events})
    return out


def train(impl, seed, W, spec=MLP, cap=25.0, plan=({},) * 3, groups=None, timeout=T, own_start=False):
    return run_ranks(body_train, W, seed, spec, cap, list(plan), groups, own_start, impl=impl, timeout=timeout)


# ----------------------------------------------------------------------------- the oracle

def forward64(params, state, spec, x, skip):
    """The model in float64: ``params`` (trainable leaves) over ``state`` (frozen layers, ``scale``)."""
    return train_net({**{k: v.double() for k, v in state.items()}, **params}, spec, x, skip)


def oracle(seed, spec, W, plan, ranks=None):
    """Per step: the averaged gradients after a synchronised backward (None where no rank
    produced one) with each rank's own local gradients (``own``), each rank's local
    accumulated gradients after a ``no_sync`` one, and the parameters after the step, all
    from rank 0's initial state (every training case starts there), in float64.
    ``ranks``: the global ranks of the group (default ``0..W-1``; they draw the batches)."""
    ranks = list(range(W)) if ranks is None else ranks
    state = init_state(seed, spec, 0)
    names = [n for n, _, _ in trainable(spec)]
    params = {n: state[n].double().clone().requires_grad_(True) for n in names}
    local = [{n: None for n in names} for _ in range(W)]  # each rank's .grad
    steps = []
    for step, p in enumerate(plan):
        for r, gr in enumerate(ranks):
            x, go = batch(seed, gr, step, spec)
            skip = p.get("skip", {}).get(gr, [])
            out = forward64(params, state, spec, x, skip)
            used = [n for n in names if n.split(".")[1] not in skip]
            grads = torch.autograd.grad((out * go.double()).sum(), [params[n] for n in used])
            for n, g in zip(used, grads):
                local[r][n] = g if local[r][n] is None else local[r][n] + g
        if p.get("no_sync"):
            steps.append({"local": [dict(d) for d in local], "params": {n: t.detach().clone() for n, t in params.items()}})
            continue
        avg = {}
        for n in names:
            got = [local[r][n] for r in range(W)]
            avg[n] = None if all(g is None for g in got) else \
                sum(g if g is not None else torch.zeros_like(params[n]) for g in got) / W
        with torch.no_grad():
            for n in names:
                if avg[n] is not None:
                    params[n] -= LR * avg[n]
        steps.append({"grads": avg, "own": [dict(d) for d in local],
                      "params": {n: t.detach().clone() for n, t in params.items()}})
        local = [{n: None for n in names} for _ in range(W)]
    return steps


def check_grads(res, want, W, step, rank, what="gradient", own=None, world=None):
    """``want``: the gradients expected on this rank; ``own``: this rank's local gradients
    (after a synchronised backward), to name a DDP that left them unaveraged; ``world``: the
    world's size where the group is smaller, to name a DDP that divides by it."""
    for n, w in want.items():
        g = res["grads"].get(n)
        case = f"W={W}, step {step}, rank {rank}, {n}"
        if w is None:
            continue
        if g is None:
            raise AssertionError(f"{what} of {n} is None after backward ({case}): every parameter some rank used "
                                 "must hold the average")
        if W > 1 and torch.allclose(g.double(), w * W, atol=ATOL * W, rtol=0) and not torch.allclose(
                g.double(), w, atol=ATOL, rtol=0):
            raise AssertionError(f"{what} of {n} is W={W} times the average ({case}): the gradients are summed, "
                                 "not averaged (divide the all-reduced sum by the group's size)")
        if world and world != W and torch.allclose(g.double(), w * W / world, atol=ATOL, rtol=0) and \
                not torch.allclose(g.double(), w, atol=ATOL, rtol=0):
            raise AssertionError(f"{what} of {n} is the group's sum divided by the world's size ({world}), not the "
                                 f"group's ({W}) ({case}): W = dist.get_world_size(group)")
        mine = (own or {}).get(n)
        if W > 1 and mine is not None and torch.allclose(g.double(), mine, atol=ATOL, rtol=0) and not torch.allclose(
                g.double(), w, atol=ATOL, rtol=0):
            raise AssertionError(f"the gradients were not averaged: {n}.grad is this rank's own local gradient "
                                 f"after backward ({case}). All-reduce the gradients and write the average back "
                                 "into p.grad (a post-accumulate-grad hook is called with the parameter, not its "
                                 "gradient: read p.grad)")
        assert_close(g, w, atol=ATOL, rtol=RTOL, what=f"{what} of {n}", case=case)


def check_params(res, want, W, step, rank):
    for n, w in want.items():
        assert_close(res["params"][n], w, atol=ATOL, rtol=RTOL, what=f"parameter {n} after SGD", case=
                     f"W={W}, step {step}, rank {rank}")


def check_training(results, seed, spec, W, plan, ranks=None, world=None):
    want = oracle(seed, spec, W, plan, ranks)
    for i, (rank, res) in enumerate(zip(ranks or range(W), results)):
        for step, (r, w) in enumerate(zip(res["steps"], want)):
            if "local" in w:
                check_grads(r, w["local"][i], W, step, rank, what="local gradient under no_sync()")
            else:
                check_grads(r, w["grads"], W, step, rank, own=w["own"][i], world=world)
            check_params(r, w["params"], W, step, rank)


# ----------------------------------------------------------------------------- event log checks

def launches(events):
    return [e for e in events if e["k"] == "launch"]


def check_once_per_bucket(step, buckets, spec, W, rank, step_no):
    """One collective per bucket, in index order, with exactly the bucket's elements in its
    dtype; nothing before forward ends, no point-to-point ops. (Whether it is asynchronous
    is overlap, graded by ``check_overlap``.)"""
    case = f"W={W}, rank {rank}, backward {step_no}"
    ev = step["events"]
    p2p = [e["k"] for e in ev if e["k"] in ("send", "recv")]
    assert not p2p, f"{case}: point-to-point {p2p[0]} during the step: the contract has one collective per bucket"
    marks = [e["k"] for e in ev]
    fwd = marks.index("forward_done")
    assert not launches(ev[:fwd]), f"{case}: forward communicated ({launches(ev[:fwd])[0]['op']}): forward is the " \
                                   "module's and sends nothing"
    dims = {n: (math.prod(s), str(dt).removeprefix("torch.")) for n, s, dt in trainable(spec)}
    got = launches(ev)
    c10d = [e for e in ev if e["k"] == "c10d"]
    assert len(c10d) == len(got), (
        f"{case}: {len(got)} collective call(s) seen through torch.distributed but {len(c10d)} collective "
        "dispatcher op(s) ran: every collective goes through torch.distributed (no counter tampering, no op "
        "reached past it)")
    if W == 1 and not got:
        return
    assert len(got) == len(buckets), (
        f"{case}: {len(got)} collective call(s) for {len(buckets)} bucket(s) "
        f"({', '.join(e['op'] for e in got[:6])}): exactly one per bucket")
    for i, (e, b) in enumerate(zip(got, buckets)):
        numel = sum(dims[n][0] for n in b)
        assert e.get("numel") == numel, (
            f"{case}: collective {i} carries {e.get('numel')} elements, bucket {i} ({', '.join(b)}) has {numel}: "
            "buckets are launched in index order, each with its own gradients only, each element once")
        assert e.get("dtype") == dims[b[0]][1], (
            f"{case}: bucket {i} ({b[0]}, ...) is {dims[b[0]][1]} but was sent as {e.get('dtype')}: each element in "
            "its own dtype")


def check_bucket_sums(step, buckets, own, W, rank, step_no):
    """Each launch carries its bucket: the sum of the launched tensor (recorded by the counter
    at the launch, before any byte moved) is the sum of this rank's local gradients of that
    bucket (``own``, float64; a parameter without one counts as zeros), or that sum over W
    (divided before the all-reduce). A launch of zeros, with the gradients sent another way
    (the group's key-value store, a thread), carries nothing and is not credited."""
    case = f"W={W}, rank {rank}, backward {step_no}"
    for i, (e, names) in enumerate(zip(launches(step["events"]), buckets)):
        grads = [own[n] for n in names if own.get(n) is not None]
        want = float(sum(g.sum() for g in grads)) if grads else 0.0
        scale = float(sum(g.abs().sum() for g in grads)) if grads else 0.0
        got = e.get("sum")
        tol = 1e-5 * scale + 1e-9
        assert got is not None and (abs(got - want) <= tol or abs(got - want / W) <= tol), (
            f"{case}: collective {i} does not carry bucket {i} ({', '.join(names)}): its elements sum to {got}, this "
            f"rank's local gradients of the bucket to {want:.6g} ({want / W:.6g} divided by W): launch the bucket's "
            "own gradients (every byte of the average crosses the launched collectives, nothing else)")


def check_overlap(step, buckets, W, rank, step_no):
    """Overlap: every launch is asynchronous; bucket i is launched before the next gradient
    is ready once buckets 0..i are complete; no wait happens before the last gradient is
    ready. Every parameter must report its gradient ready (the model's own hooks, registered
    first: a DDP that removes them, or replaces the parameters, is refused here)."""
    case = f"W={W}, rank {rank}, backward {step_no}"
    ev = step["events"]
    blocking = next((i for i, e in enumerate(launches(ev)) if not e.get("async_op")), None)
    assert blocking is None, (
        f"{case}: no overlap: bucket {blocking} was sent with a blocking call (async_op=False blocks backward until "
        "the bytes have arrived): launch with async_op=True and wait at the end of backward")
    ready_at = {}
    for i, e in enumerate(ev):
        if e["k"] == "ready":
            ready_at.setdefault(e["p"], i)
    silent = [n for b in buckets for n in b if n not in ready_at]
    assert not silent, (f"{case}: the model's gradient-ready hooks did not fire for {', '.join(silent[:3])}: the DDP "
                        "removed the model's hooks or replaced its parameters (keep the same Parameter objects, "
                        "register your hooks beside the existing ones)")
    ready_idx = sorted(ready_at.values())
    last_ready = ready_idx[-1] if ready_idx else -1
    launch_idx = [i for i, e in enumerate(ev) if e["k"] == "launch"]
    complete = -1
    for b, names in enumerate(buckets):
        if any(n not in ready_at for n in names):
            break  # this and the later buckets go at the end of backward
        complete = max([complete] + [ready_at[n] for n in names])
        nxt = next((i for i in ready_idx if i > complete), None)
        if nxt is None:
            break
        at = launch_idx[b] if b < len(launch_idx) else None
        if at is None or at > nxt:
            first = next(e["p"] for e in ev[nxt:] if e["k"] == "ready")
            hint = ("all-reduce after backward? every bucket must be launched from the hook that completes it"
                    if not any(i < last_ready for i in launch_idx) else
                    "launched too late: as soon as it is complete and the earlier buckets are launched")
            raise AssertionError(f"{case}: no overlap: bucket {b} ({', '.join(names)}) was complete, but the "
                                 f"gradient of {first} (a later bucket) became ready before it was launched ({hint})")
    waits = [i for i, e in enumerate(ev) if e["k"] == "wait"]
    assert not waits or waits[0] > last_ready, (
        f"{case}: no overlap: a hook waited on a collective before backward's last gradient was ready (Work.wait "
        "inside the hook blocks backward until the bytes have arrived): wait only in the end-of-backward callback")


# ----------------------------------------------------------------------------- Part A

@pytest.mark.part("A")
@pytest.mark.points(3)
@pytest.mark.parametrize("W", [1, 2, 3, 4], ids=lambda w: f"W{w}")
def test_matches_single_process_training_on_the_concatenated_batch(W, impl, seed):
    results = train(impl, seed, W, MLP, cap=25.0, plan=[{}] * 3)
    check_training(results, seed, MLP, W, [{}] * 3)


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W, groups", [(2, None), (4, [[0, 1], [2, 3]])], ids=["W2", "W4-two-groups"])
def test_ranks_start_from_rank_0_parameters_and_buffers(W, groups, impl, seed):
    """The only case whose ranks start from their own weights and buffer: after construction
    every rank holds its group's rank 0's (the frozen layer's and the buffer too)."""
    results = train(impl, seed, W, WIDE, cap=25.0, plan=[], groups=groups, own_start=True)
    for members in groups or [list(range(W))]:
        want = init_state(seed, WIDE, members[0])
        for rank in members:
            res, case = results[rank], f"W={W}, rank {rank}" + (f" in group {members}" if groups else "")
            w = res["wraps"]
            assert w["module"], f"{case}: ddp.module is not the wrapped module (a registered submodule, the same " \
                                "object)"
            assert w["same_params"] and w["same_buffers"], (
                f"{case}: the wrapped module's parameters or buffers were replaced by new objects: overwrite them in "
                "place (an optimizer built before wrapping must stay valid)")
            for k, w in want.items():
                got = res["state0"][k]
                what = "buffer" if k == "scale" else "parameter"
                if rank != members[0] and torch.equal(got, init_state(seed, WIDE, rank)[k]):
                    raise AssertionError(f"{case}: the {what} {k} is this rank's own after construction: broadcast "
                                         "every parameter and buffer from rank 0 of the group (in place)")
                if members[0] != 0 and torch.equal(got, init_state(seed, WIDE, 0)[k]):
                    raise AssertionError(f"{case}: the {what} {k} is world rank 0's after construction: broadcast "
                                         "from rank 0 of the group (group_src=0, group=group), not of the world")
                assert_close(got, w, atol=0, rtol=0, what=f"{what} {k} after construction", case=case)


@pytest.mark.part("A")
@pytest.mark.parametrize("W", [2, 4], ids=lambda w: f"W{w}")
def test_mixed_dtypes_frozen_layer_and_several_buckets(W, impl, seed):
    results = train(impl, seed, W, WIDE, cap=0.0005, plan=[{}] * 2)
    check_training(results, seed, WIDE, W, [{}] * 2)


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_group_is_honoured(impl, seed):
    """W=4 split into groups {0, 1} and {2, 3}: each trains on its own batches (every rank
    starts from the same weights: the group's broadcast is graded by the broadcast test)."""
    groups = [[0, 1], [2, 3]]
    results = train(impl, seed, 4, MLP, cap=0.0005, plan=[{}] * 2, groups=groups)
    for members in groups:
        try:
            check_training([results[r] for r in members], seed, MLP, 2, [{}] * 2, ranks=members, world=4)
        except AssertionError as e:
            raise AssertionError(f"group {members} of W=4: {e} (all-reduce on the group, divide by the "
                                 "group's size)") from None


def body_validation(rk, caps):
    model = rk.build_model(MLP, init_state(0, MLP, 0))
    out = []
    for cap in caps:
        try:
            rk.call(rk.impl.DDP, model, bucket_cap_mb=cap, forbid=FORBID)
            out.append("no error")
        except Exception as e:  # noqa: BLE001 - the type is what is graded
            out.append(type(e).__name__)
    return out


# each refused cap beside its valid neighbour (the same call, the cap made valid)
BAD_CAPS = [(-1.0, 1.0), (float("nan"), float("inf")), (-1e-9, 0.0)]


@pytest.mark.part("A")
def test_bad_bucket_cap_raises_value_error(impl):
    """A refusal earns credit only where the valid neighbour is accepted."""
    got = run_ranks(body_validation, 1, [c for pair in BAD_CAPS for c in pair], impl=impl, timeout=T)[0]
    for (bad, good), g_bad, g_good in zip(BAD_CAPS, got[::2], got[1::2]):
        assert g_good == "no error", f"DDP(module, bucket_cap_mb={good}) raised {g_good}: a number >= 0 is a valid " \
                                     "cap (MiB)"
        assert g_bad == "ValueError", f"DDP(module, bucket_cap_mb={bad}): {g_bad}, expected ValueError (a number >= 0)"


def body_forward(rk, seed):
    model = rk.build_model(MLP, init_state(seed, MLP, 0))  # every rank the same: the broadcast is graded elsewhere
    ddp = rk.call(rk.impl.DDP, model, forbid=FORBID).out
    x, _ = batch(seed, rk.rank, 9, MLP)
    c = rk.call(ddp, x, forbid=FORBID)
    return {"out": c.out, "comm": c.comm["collectives"], "sent": c.comm["sent_msgs"]}


@pytest.mark.part("A")
def test_forward_is_the_modules_and_communicates_nothing(impl, seed):
    results = run_ranks(body_forward, 2, seed, impl=impl, timeout=T)
    state = init_state(seed, MLP, 0)
    for rank, res in enumerate(results):
        assert not res["comm"] and not res["sent"], f"rank {rank}: forward communicated {res['comm']}: it returns " \
                                                   "self.module(*args, **kwargs) and sends nothing"
        x, _ = batch(seed, rank, 9, MLP)
        assert_close(res["out"], forward64({}, state, MLP, x, ()), atol=ATOL, rtol=0, what="forward output",
                     case=f"rank {rank}")




@pytest.mark.part("A")
def test_built_from_scratch(impl, seed):
    names = imported_names(source(impl))
    bad = sorted(n for n in names if any(n == m or n.startswith(m + ".") for m in FORBIDDEN_MODULES)
                 or n.split(".")[-1] in ("DistributedDataParallel", "Reducer") or n.split(".")[0] == "harness"
                 or any(part in ("_post_accumulate_grad_hooks", "_backward_hooks", "_ACTIVE", "_depth")
                        for part in n.split(".")))
    assert not bad, f"the submission uses {bad[0]}: build DDP from torch.distributed collectives and autograd " \
                    "hooks (DistributedDataParallel, Reducer, torch.distributed.algorithms, _composable and fsdp are " \
                    "not allowed)"
    results = train(impl, seed, 2, MLP, plan=[{}])
    assert not any(r["torch_ddp"] for r in results), "DDP is a torch.nn.parallel.DistributedDataParallel"


# ----------------------------------------------------------------------------- Part B

CAPS = {"cap0-every-param-alone": 0.0, "cap-64B": 64 / 2**20, "cap-300B-param-larger-than-cap": 300 / 2**20,
        "cap-1KiB": 1 / 1024, "cap-default-25MiB": 25.0, "cap-144B-exactly-a-bucket": 144 / 2**20,
        "int-cap-0": 0, "int-cap-25": 25, "cap-inf": float("inf")}
# a first layer over 1 MiB (torch's DDP caps its first bucket at 1 MiB; the contract has no smaller first bucket)
BIG = {"layers": [layer("big", 600, 600), layer("head", 600, 4)]}


def body_buckets(rk, spec, caps):
    model = rk.build_model(spec, init_state(1, spec, rk.rank))
    return [rk.call(rk.impl.DDP, model, bucket_cap_mb=c, forbid=FORBID).out.buckets for c in caps]


@pytest.mark.part("B")
@pytest.mark.points(3)
def test_bucket_partition_reverse_order_cap_and_dtype(impl):
    caps = list(CAPS.values())
    got = run_ranks(body_buckets, 1, WIDE, caps, impl=impl, timeout=T)[0]
    big = run_ranks(body_buckets, 1, BIG, [25.0], impl=impl, timeout=T)[0][0]
    want_big = expected_buckets(BIG, 25.0)
    assert [set(b) for b in big] == [set(b) for b in want_big], (
        f"self.buckets of a model whose first gradients are over 1 MiB, bucket_cap_mb=25:\n  got      {big}\n"
        f"  expected {want_big}\n(no smaller first bucket: every bucket has the same cap)")
    for (label, cap), g in zip(CAPS.items(), got):
        want = expected_buckets(WIDE, cap)
        if not isinstance(g, list) or not all(isinstance(b, list) for b in g):
            raise AssertionError(f"self.buckets is {type(g).__name__}: a list of lists of parameter names")
        dtypes = {n: dt for n, _, dt in trainable(WIDE)}
        mixed = next((b for b in g if len({dtypes.get(n) for n in b}) > 1), None)
        if mixed is not None:
            raise AssertionError(f"bucket {mixed} mixes float32 and float64 gradients ({label}): a parameter of "
                                 "another dtype closes the bucket and opens a new one (each element is sent in its "
                                 "own dtype)")
        if [set(b) for b in g] != [set(b) for b in want] and \
                [set(b) for b in g] == [set(b) for b in expected_buckets(WIDE, cap * 10**6 / 2**20)]:
            raise AssertionError(f"the cap is read in megabytes (10**6 bytes), not MiB ({label}): bucket_cap_mb="
                                 f"{cap!r} is {cap * 2**20:g} bytes (2**20 bytes per MiB)")
        if [sorted(b) for b in g] == [sorted(b) for b in reversed(want)] and len(want) > 1:
            raise AssertionError(f"buckets in forward order ({label}): the contract builds them in reverse "
                                 "module.parameters() order (backward produces the last layers' gradients first)")
        assert [set(b) for b in g] == [set(b) for b in want], (
            f"self.buckets with bucket_cap_mb={cap!r} ({label}):\n  got      {g}\n  expected {want}\n(one pass in "
            "reverse parameter order; a bucket closes when the next gradient would take it past the cap or has "
            "another dtype; a parameter larger than the cap is alone; frozen parameters are in no bucket)")


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("W, cap", [(2, 0.0), (3, 0.0005), (2, 25.0)], ids=["W2-cap0", "W3-cap512B", "W2-one-bucket"])
def test_one_collective_per_bucket_each_element_once(W, cap, impl, seed):
    results = train(impl, seed, W, WIDE, cap=cap, plan=[{}] * 2)
    want = expected_buckets(WIDE, cap)
    for rank, res in enumerate(results):
        for i, step in enumerate(res["steps"]):
            check_once_per_bucket(step, want, WIDE, W, rank, i)
    check_training(results, seed, WIDE, W, [{}] * 2)


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("W, cap", [(2, 0.0), (2, 0.0005), (4, 0.0)], ids=["W2-cap0", "W2-cap512B", "W4-cap0"])
def test_buckets_launched_during_backward(W, cap, impl, seed):
    results = train(impl, seed, W, WIDE, cap=cap, plan=[{}] * 2)
    want = expected_buckets(WIDE, cap)
    local = oracle(seed, WIDE, W, [{}] * 2)
    for rank, res in enumerate(results):
        for i, step in enumerate(res["steps"]):
            check_once_per_bucket(step, want, WIDE, W, rank, i)
            check_overlap(step, want, W, rank, i)
            check_bucket_sums(step, want, local[i]["own"][rank], W, rank, i)


# a 1 MiB model: what the loopback carries is the payload (gloo's set-up and headers are tens of KB)
LOOPBACK = {"layers": [layer("big", 512, 512), layer("head", 512, 4)]}


@pytest.mark.part("B")
@pytest.mark.parametrize("W", [2, 3], ids=lambda w: f"W{w}")
def test_every_byte_crosses_the_bucket_all_reduces(W, impl, seed):
    """The bytes the ranks' private loopback carried over the whole run (read outside every
    rank): the construction broadcast, (W-1) * G_state, and per step the all-reduces of the
    buckets, a ring's 2 * (W-1) * G_grads over all ranks, +2% and 256 KiB for gloo's set-up and
    the TCP/IP headers. Gradients sent another way besides (the group's key-value store, a socket,
    a thread's collective) show here."""
    plan = [{}] * 2
    results = train(impl, seed, W, LOOPBACK, cap=25.0, plan=plan)
    check_training(results, seed, LOOPBACK, W, plan)
    if results.loopback_bytes is None:
        return  # the ranks share this machine's network: no outside figure
    grads = sum(math.prod(s) * torch.empty((), dtype=dt).element_size() for _, s, dt in trainable(LOOPBACK))
    state = sum(t.numel() * t.element_size() for t in init_state(seed, LOOPBACK, 0).values())
    payload = (W - 1) * state + len(plan) * 2 * (W - 1) * grads
    limit = payload * 1.02 + 256 * 1024
    runs = [results]  # segments retransmitted under load count twice: run again, the fewest bytes count
    while runs[-1].loopback_bytes > limit and runs[-1].tcp_retransmits and len(runs) < 3:
        runs.append(train(impl, seed, W, LOOPBACK, cap=25.0, plan=plan))
    best = min((r for r in runs if r.loopback_bytes is not None), key=lambda r: r.loopback_bytes)
    assert best.loopback_bytes <= limit, (
        f"W={W}, {len(plan)} steps of a model with {grads} bytes of gradients: the ranks' network carried "
        f"{best.loopback_bytes} bytes (read outside the ranks; the fewest of {len(runs)} runs), the construction "
        f"broadcast and one ring all-reduce of every bucket per step send {payload:.0f} (+2% and 256 KiB for set-up "
        "and headers): the gradients travel only in the buckets' all-reduces (not through the group's store, a "
        "socket or another collective besides)")


# ----------------------------------------------------------------------------- Part C

NO_SYNC = [{"no_sync": True}, {"no_sync": True}, {}, {"no_sync": True}, {}]


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [2, 3], ids=lambda w: f"W{w}")
def test_no_sync_sends_nothing_and_the_next_backward_averages_the_sum(W, impl, seed):
    results = train(impl, seed, W, MLP, cap=0.0005, plan=NO_SYNC)
    for rank, res in enumerate(results):
        for i, (p, step) in enumerate(zip(NO_SYNC, res["steps"])):
            if p.get("no_sync"):
                sent = launches(step["events"]) or [e for e in step["events"] if e["k"] in ("send", "recv")]
                assert not sent, f"W={W}, rank {rank}, backward {i}: inside no_sync() the DDP communicated " \
                                 f"({sent[0].get('op', sent[0]['k'])}): accumulate locally, send nothing"
    check_training(results, seed, MLP, W, NO_SYNC)


def train_unused(impl, seed, W, cap, plan):
    """``train`` on WIDE with layers skipped. A hang there, or ranks whose collectives no longer
    pair up (gloo: "collective mismatch", a size that does not match), is the unused-parameter
    fault: some rank never launched a bucket the others launched."""
    try:
        return train(impl, seed, W, WIDE, cap=cap, plan=plan, timeout=T_HANG)
    except (RankTimeout, RankError) as e:
        if isinstance(e, RankError) and not any(k in str(e) for k in ("collective mismatch", "doesn't match")):
            raise
        raise AssertionError(f"the ranks' collectives fell out of step with unused parameters (W={W}, bucket_cap_mb="
                             f"{cap:g}; a hang, or one rank's bucket met another's next one): a bucket "
                             "holding a parameter that got no gradient on some rank was never launched there (at the "
                             "end of backward, launch every bucket still waiting, in order, with zeros for None "
                             f"gradients)\n{e}") from None


UNUSED = [{"skip": {0: ["b"]}}, {"skip": {1: ["b", "c"]}}, {"skip": {r: ["c"] for r in range(4)}}, {}]


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("W, cap", [(2, 0.0), (3, 0.0005), (2, 25.0)], ids=["W2-cap0", "W3-cap512B", "W2-one-bucket"])
def test_unused_parameters_complete_without_a_hang(W, cap, impl, seed):
    results = train_unused(impl, seed, W, cap, UNUSED)
    want = expected_buckets(WIDE, cap)
    for rank, res in enumerate(results):
        for i, step in enumerate(res["steps"]):
            check_once_per_bucket(step, want, WIDE, W, rank, i)
    check_training(results, seed, WIDE, W, UNUSED)


ACCUMULATED = [{"no_sync": True}, {"skip": {1: ["b"]}}, {"no_sync": True, "skip": {0: ["c"]}}, {"skip": {0: ["c"]}}]


@pytest.mark.part("C")
@pytest.mark.parametrize("W", [2, 3], ids=lambda w: f"W{w}")
def test_an_unused_parameter_contributes_its_accumulated_gradient(W, impl, seed):
    results = train_unused(impl, seed, W, 0.0005, ACCUMULATED)
    check_training(results, seed, WIDE, W, ACCUMULATED)


# --- Part D: step time against torch's DistributedDataParallel ---------------------------------

def deep(width, depth):
    return {"layers": [layer(f"l{i}", width, width) for i in range(depth)]}


def perf_batch(seed, rank, i, spec, B):
    g = torch.Generator().manual_seed((seed * 7919 + rank * 104729 + i * 13 + 3) % 2**63)
    d_in, d_out = spec["layers"][0]["in"], spec["layers"][-1]["out"]
    return torch.randn(B, d_in, generator=g), torch.randn(B, d_out, generator=g) / B


def perf_inputs(seed, rank, spec, B, repeats, device):
    """The timed pool and the 3 warm-up steps of ``rank``: ``(x, grad_output)`` each."""
    return ([tuple(t.to(device) for t in perf_batch(seed, rank, i, spec, B)) for i in range(repeats)],
            [tuple(t.to(device) for t in perf_batch(seed, rank, 1000 + i, spec, B)) for i in range(3)])


def baseline_step(rk, seed, spec, cap, device):
    """torch's DDP around rank 0's initial model on this rank: its step function (a handle)."""
    return rk.step_fn(rk.torch_ddp(rk.build_model(spec, init_state(seed, spec, 0), device=device), cap))


def body_twin(rk, seed, spec, cap, B, repeats, device):
    """Rank ``rk`` of the clean twin (ranks that never imported the submission): torch DDP's step
    alone, timed the same way; its median, seconds per step."""
    pool, warm = perf_inputs(seed, rk.rank, spec, B, repeats, device)
    return timed(rk.nothing(), baseline_step(rk, seed, spec, cap, device), pool, warmup_inputs=warm, no_grad=False,
                 verify_baseline=False, device=device).baseline_s


def body_step_time(rk, seed, spec, cap, B, repeats, device):
    """Rank ``rk``: the submission's DDP and torch's, each around its own copy of the same
    model, one training step each (forward, backward; no update) timed interleaved by the
    timed probe; every timed step's output and averaged gradients are checked here against
    the float64 model on the concatenated batch."""
    state = init_state(seed, spec, 0)
    ddp = rk.call(rk.impl.DDP, rk.build_model(spec, state, device=device), bucket_cap_mb=cap, forbid=FORBID).out
    pool, warm = perf_inputs(seed, rk.rank, spec, B, repeats, device)
    names = [n for n, _, _ in trainable(spec)]
    params = {n: state[n].double() for n in names}

    def check(i, got):
        out, grads = got
        x, go = perf_batch(seed, rk.rank, i, spec, B)
        case = f"W={rk.world_size}, rank {rk.rank}, timed step {i}"
        assert_close(out.cpu(), forward64(params, state, spec, x, ()), atol=1e-4, rtol=1e-4,
                     what="a timed step's output is wrong: no performance credit", case=case)
        want = averaged_grads(seed, spec, state, rk.world_size, i, B)
        for n, g in zip(names, grads):
            assert g is not None, f"{case}: {n} has no gradient after a timed step: no performance credit"
            assert_close(g.cpu(), want[n], atol=1e-4, rtol=1e-3, case=case,
                         what=f"a timed step's averaged gradient of {n} is wrong: no performance credit")

    t = timed(rk.step_fn(ddp), baseline_step(rk, seed, spec, cap, device), pool, warmup_inputs=warm, check=check,
              no_grad=False,
              verify_baseline=False, forbid=FORBID, device=device,
              reason="the contract forbids DistributedDataParallel and Reducer")
    return {"student_s": t.candidate_s, "torch_s": t.baseline_s, "outside": t.outside,
            "claimed_student_s": t.figures["claimed_candidate_s"], "claimed_torch_s": t.figures["claimed_baseline_s"]}


_AVERAGED: dict = {}


def averaged_grads(seed, spec, state, W, i, B):
    """The gradients of pool step ``i`` averaged over the W ranks, float64 (computed once)."""
    key = (seed, repr(spec), W, i, B)
    if key not in _AVERAGED:
        names = [n for n, _, _ in trainable(spec)]
        params = {n: state[n].double().requires_grad_(True) for n in names}
        total = {n: 0.0 for n in names}
        for r in range(W):
            x, go = perf_batch(seed, r, i, spec, B)
            grads = torch.autograd.grad((forward64(params, state, spec, x, ()) * go.double()).sum(),
                                        [params[n] for n in names])
            total = {n: total[n] + g for n, g in zip(names, grads)}
        _AVERAGED[key] = {n: g / W for n, g in total.items()}
    return _AVERAGED[key]


def step_time(impl, seed, W, spec, cap, B, device, timeout=240.0):
    """The slowest rank's median step of the submission's DDP over torch DDP's, timed interleaved on
    the submission's ranks; torch DDP's median graded within ``against_twin``'s factor of its clean
    twin's (ranks that never imported the submission)."""
    run = dict(impl=impl, timeout=timeout, device="cuda" if device == "cuda" else "cpu")
    res = run_ranks(body_step_time, W, seed, spec, cap, B, 10, device, **run)
    twin = max(run_ranks(body_twin, W, seed, spec, cap, B, 10, device, clean=True, **run))
    student, worker_ddp = max(r["student_s"] for r in res), max(r["torch_s"] for r in res)
    torch_ddp, clamped = against_twin(worker_ddp, twin, device)
    return student / torch_ddp, {"student_ms": student * 1e3, "torch_ddp_ms": torch_ddp * 1e3, "W": W,
                                 "bucket_cap_mb": cap, "params": sum(L["in"] * L["out"] + L["out"]
                                                                     for L in spec["layers"]),
                                 "outside": any(r["outside"] for r in res),
                                 "in_process_student_ms": max(r["claimed_student_s"] for r in res) * 1e3,
                                 "in_process_torch_ddp_ms": max(r["claimed_torch_s"] for r in res) * 1e3,
                                 "torch_ddp_beside_you_ms": worker_ddp * 1e3, "torch_ddp_alone_ms": twin * 1e3,
                                 "baseline_clamped": clamped}


@pytest.mark.part("D")
@pytest.mark.points(0)
def test_cpu_step_time_vs_torch_ddp(impl, seed, record_perf):
    """Informational on CPU (gloo, 2 ranks): one training step's time over torch DDP's with
    the same bucket size, same run, interleaved; the timed steps' gradients are checked. The
    figure is CPU time: gloo's threads (both DDPs' communication) run outside the per-call
    thread clocks, and where the worker's whole CPU time is not explained by the per-call
    claims (``in_process_*``) the rest is charged to your DDP (``outside=1``). Torch DDP's time
    beside your code is graded within a factor of its time alone, on ranks that never imported
    your module (``torch_ddp_alone_ms``)."""
    ratio, figures = step_time(impl, seed, 2, deep(96, 4), 0.05, 16, "cpu")
    record_perf("ddp_step_vs_torch_ddp_cpu", ratio, **figures)


@pytest.mark.gpu
@pytest.mark.part("D")
@pytest.mark.perf("ddp_step_vs_torch_ddp")
def test_step_time_vs_torch_ddp(impl, seed, record_perf):
    """NCCL on the available GPUs (2..4): a 6-layer, 3.5M-parameter model with 4 MiB buckets;
    ratio = your step time / torch DDP's (lower is better)."""
    W = min(torch.cuda.device_count(), 4)
    if W < 2:
        pytest.skip("needs at least 2 CUDA GPUs for a data-parallel step over NCCL")
    ratio, figures = step_time(impl, seed, W, deep(768, 6), 4.0, 64, "cuda")
    record_perf("ddp_step_vs_torch_ddp", ratio, **figures)
