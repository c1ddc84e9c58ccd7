"""Hidden graders of lab 09, pipeline parallelism (GPipe and 1F1B, the lab 09 contract).

Part A compares ``schedule`` action by action, for p in 1..4 and M in 1..8, with the
contract's lists built here, and ``bubble_fraction`` with ``(p-1)/(M+p-1)``.

Parts B and C run ``run_pipeline`` on p spawned gloo ranks, one stage each: a trusted
``TrainNet`` stage built on the rank with ``watch`` on, which logs every call (its input
rows, the order of forward calls and backward starts) and counts the calls that hold
tensors autograd saved (``saved_tensors_hooks``: from the first tensor saved in a call
until autograd frees its last). Stage 0 gets the real microbatches, the later stages
NaN-filled tensors of the shape they receive. Every collective except ``barrier`` raises
during the call. The parent chains the stages in float64 on ``torch.cat(microbatches)``
and compares the last stage's mean loss and every stage's gradients (atol = rtol = 1e-5).
A run past its watchdog is a deadlock.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.toolkit import DATA_COLLECTIVES, assert_close, param_grads, run_ranks, source, train_net

T = 20.0  # an honest run takes about a second; a deadlocked one waits for this watchdog
ATOL = RTOL = 1e-5
KINDS = ("gpipe", "1f1b")
FORBIDDEN = [c for c in DATA_COLLECTIVES]  # barrier allowed
P2P_OPS = {"send", "recv_", "recv_any_source_"}
PIPELINING = ["torch.distributed.pipelining.stage.PipelineStage", "torch.distributed.pipelining.PipelineStage",
              "torch.distributed.pipelining.schedules.Schedule1F1B", "torch.distributed.pipelining.Schedule1F1B",
              "torch.distributed.pipelining.schedules.ScheduleGPipe", "torch.distributed.pipelining.ScheduleGPipe",
              "torch.distributed.pipelining.pipeline", "torch.distributed.pipelining.build_stage",
              # the constructors every stage and schedule runs: a class reached through a saved name still hits them
              "torch.distributed.pipelining.stage._PipelineStageBase.__init__",
              "torch.distributed.pipelining.schedules._PipelineSchedule.__init__"]


# ----------------------------------------------------------------------------- Part A: schedules

def want_schedule(kind, p, M, s):
    """The contract's actions of stage ``s``, built here from the rule."""
    if kind == "gpipe":
        return [("F", m) for m in range(M)] + [("B", m) for m in reversed(range(M))]
    w = min(p - s - 1, M)
    out = [("F", m) for m in range(w)]
    for i in range(M - w):
        out += [("F", w + i), ("B", i)]
    return out + [("B", m) for m in range(M - w, M)]


def as_actions(got):
    if not isinstance(got, (list, tuple)):
        raise AssertionError(f"schedule returned {type(got).__name__}: a list of (str, int) tuples")
    return [tuple(a) if isinstance(a, (list, tuple)) else a for a in got]


def diagnose_schedule(kind, p, M, s, got):
    if kind == "1f1b":
        for dw, what in ((1, "one warm-up forward too many (w = min(p - s, M)?)"),
                         (-1, "one warm-up forward too few")):
            w = min(p - s - 1 + dw, M)
            if 0 <= w:
                alt = [("F", m) for m in range(w)]
                for i in range(M - w):
                    alt += [("F", w + i), ("B", i)]
                alt += [("B", m) for m in range(M - w, M)]
                if got == alt and alt != want_schedule(kind, p, M, s):
                    return what
    if sorted(got) == sorted(want_schedule(kind, p, M, s)):
        backs = [m for a, m in got if a == "B"]
        if kind == "gpipe" and backs == sorted(backs) and len(backs) > 1:
            return "backwards in forward order (GPipe runs them in reverse: B(M-1) .. B0)"
        return "the right actions in the wrong order"
    return ""


@pytest.mark.part("A")
@pytest.mark.points(3)
@pytest.mark.parametrize("kind", KINDS)
def test_schedule_action_by_action(kind, impl):
    for p in range(1, 5):
        for M in range(1, 9):
            for s in range(p):
                got = as_actions(impl.schedule(kind, p, M, s))
                want = want_schedule(kind, p, M, s)
                if got != want:
                    why = diagnose_schedule(kind, p, M, s, got)
                    raise AssertionError(f"schedule({kind!r}, num_stages={p}, num_microbatches={M}, stage={s}):\n"
                                         f"  got      {got}\n  expected {want}" + (f"\n  ({why})" if why else ""))


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_bubble_fraction(impl):
    for p in range(1, 9):
        for M in (1, 2, 3, 4, 7, 16, 64):
            got = impl.bubble_fraction(p, M)
            want = (p - 1) / (M + p - 1)
            if p > 1 and isinstance(got, float) and abs(got - (p - 1) / M) < 1e-12:
                raise AssertionError(f"bubble_fraction({p}, {M}) = {got}: (p-1)/M divides by the ideal time; the "
                                     f"idle fraction of the step is (p-1)/(M+p-1) = {want}")
            assert isinstance(got, float) and abs(got - want) < 1e-12, \
                f"bubble_fraction(num_stages={p}, num_microbatches={M}) = {got!r}, expected {want}"


BAD = [("schedule", ("zb", 2, 2, 0), ["kind", "zb"]), ("schedule", ("gpipe", 0, 2, 0), ["num_stages", "0"]),
       ("schedule", ("1f1b", 2, 0, 0), ["num_microbatches", "0"]), ("schedule", ("1f1b", 3, 2, 3), ["stage", "3"]),
       ("schedule", ("gpipe", 3, 2, -1), ["stage", "-1"]), ("bubble_fraction", (0, 4), ["num_stages", "0"]),
       ("bubble_fraction", (2, -1), ["num_microbatches", "-1"])]


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_bad_arguments_raise_value_error_naming_them(impl):
    for name, args, words in BAD:
        try:
            getattr(impl, name)(*args)
        except ValueError as e:
            assert all(w in str(e) for w in words), f"{name}{args}: the message {str(e)[:200]!r} must name the " \
                                                    f"argument and value ({', '.join(words)})"
        except Exception as e:  # noqa: BLE001 - the type is graded
            raise AssertionError(f"{name}{args} raised {type(e).__name__}: {str(e)[:200]}, expected ValueError")
        else:
            raise AssertionError(f"{name}{args} raised nothing, expected ValueError")


# ----------------------------------------------------------------------------- Parts B, C: the pipeline

def layer(name, d_in, d_out):
    return {"name": name, "in": d_in, "out": d_out, "bias": True, "dtype": "float32", "frozen": False}


def stages(p, widths=None, free=()):
    """p stage specs: stage s maps widths[s] -> widths[s+1]; stages in ``free`` have no parameters."""
    widths = widths or [5] + [6] * (p - 1) + [3]
    return [{"layers": [] if s in free else [layer(f"s{s}", widths[s], widths[s + 1])], "watch": True}
            for s in range(p)]


def init_state(seed, spec):
    g = torch.Generator().manual_seed(seed % 2**63)
    state = {}
    for L in spec["layers"]:
        state[f"layers.{L['name']}.weight"] = torch.randn(L["out"], L["in"], generator=g) / L["in"] ** 0.5
        state[f"layers.{L['name']}.bias"] = torch.randn(L["out"], generator=g) * 0.1
    if spec["layers"]:
        state["scale"] = 1 + 0.25 * torch.rand(spec["layers"][-1]["out"], generator=g)
    return state


def data(seed, specs, M, rows, loss):
    g = torch.Generator().manual_seed((seed * 7 + 3) % 2**63)
    d_in = specs[0]["layers"][0]["in"] if specs[0]["layers"] else 5
    xs = [torch.randn(rows, d_in, generator=g) for _ in range(M)]
    out = specs[-1]["layers"][-1]["out"] if specs[-1]["layers"] else d_in
    if loss == "cross_entropy":
        ts = [torch.randint(0, out, (rows,), generator=g) for _ in range(M)]
    else:
        ts = [torch.randn(rows, out, generator=g) for _ in range(M)]
    return xs, ts


def width_at(specs, s, d_in):
    """Rows' width of the activation stage s receives."""
    for spec in specs[:s]:
        if spec["layers"]:
            d_in = spec["layers"][-1]["out"]
    return d_in


def preseed(spec, rows, d_in):
    """The input and grad_output of one backward run before the pipeline (gradients must add)."""
    d_out = spec["layers"][-1]["out"] if spec["layers"] else d_in
    return torch.linspace(-1, 1, rows * d_in).view(rows, d_in), torch.full((rows, d_out), 0.5)


def body_pipeline(rk, seed, specs, M, rows, kind, loss, members=None, seeded=False):
    """Drives one stage: builds its watched TrainNet, runs run_pipeline under the collective
    ban, returns the loss, the gradients and what the stage saw."""
    group, stage, p = None, rk.rank, len(specs)
    if members is not None:
        group = next(g for g in rk.new_groups(members) if g is not None)
        mine = next(m for m in members if rk.rank in m)
        stage = mine.index(rk.rank)
    spec = specs[stage]
    model = rk.build_model(spec, init_state(seed + stage, spec))
    xs, ts = data(seed, specs, M, rows, loss)
    if stage:  # later stages: NaN-filled tensors of the shape they receive
        d = width_at(specs, stage, xs[0].shape[1])
        xs = [torch.full((rows, d), float("nan")) for _ in range(M)]
    fn = rk.torch_function(f"torch.nn.functional.{loss}")
    if seeded and spec["layers"]:
        x0, g0 = preseed(spec, rows, width_at(specs, stage, data(seed, specs, 1, rows, loss)[0][0].shape[1]))
        rk.backward(model, model, x0, grad_output=g0)
    rk.stage_stats(model, reset=True)
    c = rk.call(rk.impl.run_pipeline, model, stage, p, xs, ts, fn, kind=kind, group=group,
                forbid_collectives=FORBIDDEN, forbid=PIPELINING, c10d=True)
    changed = [m for m, (a, b) in enumerate(zip(c.args[3], xs)) if not torch.equal(a, b) and
               not (a.isnan().all() and b.isnan().all())]
    return {"loss": c.out, "grads": param_grads(model), "stats": rk.stage_stats(model), "comm": c.comm,
            "changed": changed}


def oracle(seed, specs, M, rows, loss, seeded=False):
    """Float64: the whole model's mean loss on the concatenated batch and every parameter's gradient
    (plus, ``seeded``, the gradient of the backward run before the call)."""
    xs, ts = data(seed, specs, M, rows, loss)
    params = []
    for s, spec in enumerate(specs):
        params.append({k: v.double().clone().requires_grad_(k != "scale") for k, v in init_state(seed + s, spec).items()})
    h = torch.cat(xs)
    for spec, pr in zip(specs, params):
        h = train_net(pr, spec, h)
    t = torch.cat(ts)
    per = [F.cross_entropy(o, tt) if loss == "cross_entropy" else F.mse_loss(o, tt.double())
           for o, tt in zip(h.split(rows), t.split(rows))]
    L = sum(per) / M
    L.backward()
    if seeded:
        for s, (spec, pr) in enumerate(zip(specs, params)):
            if spec["layers"]:
                x0, g0 = preseed(spec, rows, width_at(specs, s, xs[0].shape[1]))
                (train_net(pr, spec, x0) * g0.double()).sum().backward()
    return L.detach(), [{k: v.grad for k, v in pr.items() if k != "scale"} for pr in params]


def pipeline(impl, seed, specs, M, rows=2, kind="1f1b", loss="mse_loss", members=None, seeded=False):
    W = len(specs) if members is None else sum(len(m) for m in members)
    return run_ranks(body_pipeline, W, seed, specs, M, rows, kind, loss, members, seeded, impl=impl, timeout=T)


def check_values(results, seed, specs, M, rows, kind, loss="mse_loss", ranks=None, seeded=False):
    L, grads = oracle(seed, specs, M, rows, loss, seeded)
    ranks = ranks or list(range(len(specs)))
    p = len(specs)
    for s, r in enumerate(ranks):
        res = results[r]
        case = f"{kind}, p={p}, M={M}, stage {s}"
        assert not res["changed"], f"{case}: run_pipeline wrote into microbatches {res['changed']}: the caller's " \
                                   "tensors are inputs (receive into new buffers)"
        if s == p - 1:
            got = res["loss"]
            if not isinstance(got, torch.Tensor) or got.dim() != 0:
                raise AssertionError(f"{case}: the last stage returned {type(got).__name__} "
                                     f"{tuple(getattr(got, 'shape', ()))}, expected a 0-dim tensor (the mean loss)")
            if M > 1 and abs(float(got) - float(L) * M) < 1e-5 * max(1.0, abs(float(L) * M)):
                raise AssertionError(f"{case}: the loss is the sum over the {M} microbatches, not the mean: divide "
                                     "each L_m by M (the gradients too)")
            assert_close(got, L, atol=ATOL, rtol=RTOL, what="the returned mean loss", case=case)
        else:
            assert res["loss"] is None, f"{case}: a stage other than the last returned {res['loss']!r}, expected None"
        for name, want in grads[s].items():
            g = res["grads"].get(name)
            if g is None:
                raise AssertionError(f"{case}: {name} has no gradient after the call")
            if M > 1 and torch.allclose(g.double(), want * M, atol=ATOL * M, rtol=RTOL):
                raise AssertionError(f"{case}: the gradient of {name} is M={M} times the mean loss's: the loss of "
                                     "each microbatch is divided by M")
            if seeded and torch.allclose(g.double(), want - oracle_seed(seed, specs, s, rows)[name], atol=ATOL, rtol=RTOL):
                raise AssertionError(f"{case}: the gradient of {name} lost what .grad held before the call: gradients "
                                     "add to .grad as backward() does (no zero_grad in run_pipeline)")
            assert_close(g, want, atol=ATOL, rtol=RTOL, what=f"gradient of {name}", case=case)


def oracle_seed(seed, specs, s, rows):
    """The gradients of stage ``s``'s pre-call backward alone."""
    spec = specs[s]
    pr = {k: v.double().clone().requires_grad_(k != "scale") for k, v in init_state(seed + s, spec).items()}
    x0, g0 = preseed(spec, rows, width_at(specs, s, specs[0]["layers"][0]["in"] if specs[0]["layers"] else 5))
    (train_net(pr, spec, x0) * g0.double()).sum().backward()
    return {k: v.grad for k, v in pr.items() if k != "scale"}


def check_schedule_ran(results, specs, M, rows, kind, ranks=None):
    p = len(specs)
    for s, r in enumerate(ranks or range(p)):
        st = results[r]["stats"]
        case = f"{kind}, p={p}, M={M}, stage {s}"
        assert st["rows"] == [rows] * M, (
            f"{case}: stage_module was called {len(st['rows'])} time(s) with {st['rows']} rows: once per microbatch "
            f"per forward, with its {rows} rows (no concatenation, no recomputation)")
        got = [(a, m) for a, m in st["actions"]]
        want = want_schedule(kind, p, M, s)
        assert got == want, f"{case}: the stage ran (forward calls and backward starts, in order)\n  {got}\n" \
                            f"expected its schedule\n  {want}"


CASES = {"1f1b-p2-M4": (2, 4, "1f1b"), "1f1b-p3-M2-fewer-microbatches": (3, 2, "1f1b"),
         "1f1b-p4-M8": (4, 8, "1f1b"), "1f1b-p1-M3": (1, 3, "1f1b"), "gpipe-p4-M3": (4, 3, "gpipe"),
         "gpipe-p3-M5": (3, 5, "gpipe")}


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("p, M, kind", list(CASES.values()), ids=list(CASES))
def test_loss_and_gradients_equal_one_process(p, M, kind, impl, seed):
    specs = stages(p)
    check_values(pipeline(impl, seed, specs, M, kind=kind), seed, specs, M, 2, kind)


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("kind", KINDS)
def test_cross_entropy_a_shape_change_and_a_parameter_free_stage(kind, impl, seed):
    """Stage 0 maps 5 -> 9 features, stage 1 has no parameters (tanh), stage 2 maps 9 -> 4 classes."""
    specs = stages(3, widths=[5, 9, 9, 4], free=(1,))
    res = pipeline(impl, seed, specs, 4, rows=3, kind=kind, loss="cross_entropy")
    check_values(res, seed, specs, 4, 3, kind, loss="cross_entropy")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_a_parameter_free_first_stage_and_gradients_that_add(impl, seed):
    """Stage 0 has no parameters (nothing to differentiate there); every .grad holds a gradient
    before the call, and the pipeline's adds to it."""
    specs = stages(3, widths=[5, 5, 6, 3], free=(0,))
    res = pipeline(impl, seed, specs, 3, kind="1f1b", seeded=True)
    check_values(res, seed, specs, 3, 2, "1f1b", seeded=True)


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("kind", KINDS)
def test_each_stage_executes_its_schedule(kind, impl, seed):
    specs = stages(4)
    res = pipeline(impl, seed, specs, 6, kind=kind)
    check_schedule_ran(res, specs, 6, 2, kind)
    check_values(res, seed, specs, 6, 2, kind)


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_only_point_to_point_messages_each_received_in_the_call(impl, seed):
    specs = stages(3)
    res = pipeline(impl, seed, specs, 5, kind="1f1b")
    sent = recv = 0
    for s, r in enumerate(res):
        ops = [e.get("op") for e in r["comm"]["events"] if e["k"] == "c10d"]
        other = sorted({op for op in ops if op not in P2P_OPS and op != "barrier"})
        assert not other, f"stage {s} called {', '.join(other)}: only send/recv (and barrier) are allowed"
        sent += r["comm"]["sent_msgs"]
        recv += r["comm"]["recv_msgs"]
    assert sent == recv, f"{sent} messages sent and {recv} received by the stages in one call: every message a call " \
                         "sends is received within that call"
    check_values(res, seed, specs, 5, 2, "1f1b")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_group_is_honoured(impl, seed):
    """W=4 as two pipelines of 2 stages, groups {0, 1} and {2, 3} (stage = rank in the group)."""
    specs = stages(2)
    members = [[0, 1], [2, 3]]
    res = pipeline(impl, seed, specs, 3, kind="1f1b", members=members)
    for m in members:
        try:
            check_values(res, seed, specs, 3, 2, "1f1b", ranks=m)
        except AssertionError as e:
            raise AssertionError(f"group {m} of W=4: {e} (neighbours are group ranks stage +- 1: send to "
                                 "dist.get_global_rank(group, stage + 1))") from None


def body_wrong(rk, stage_of, p, M=1):
    spec = {"layers": [layer("w", 5, 5)]}
    model = rk.build_model(spec, init_state(1, spec))
    fn = rk.torch_function("torch.nn.functional.mse_loss")
    xs, ts = [torch.zeros(2, 5)] * M, [torch.zeros(2, 5)] * M
    try:
        c = rk.call(rk.impl.run_pipeline, model, stage_of[rk.rank], p, xs, ts, fn, forbid_collectives=FORBIDDEN,
                    forbid=PIPELINING)
        return {"error": "no error", "sent": c.comm["sent_msgs"]}
    except Exception as e:  # noqa: BLE001 - the type is graded
        return {"error": type(e).__name__, "msg": str(e)}


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_wrong_stage_or_size_raises_before_any_message(impl):
    for stage_of, p, M, what in (([0, 1], 3, 1, "num_stages=3 in a group of 2"), ([1, 0], 2, 1, "stages swapped"),
                                 ([0, 1], 2, 0, "microbatches=[]")):
        res = run_ranks(body_wrong, 2, stage_of, p, M, impl=impl, timeout=T)
        for r, out in enumerate(res):
            assert out["error"] == "ValueError", f"{what}: rank {r} got {out['error']} {out.get('msg', '')[:200]}, " \
                                                 "expected ValueError before any message"


NO_DEADLOCK = [(p, M, kind) for kind in KINDS for p in (2, 3, 4) for M in (1, 2, 3, 7) if kind == "1f1b" or M in (1, 3)]


@pytest.mark.part("B")
@pytest.mark.points(3)
def test_no_deadlock_for_any_stage_count_and_microbatch_count(impl, seed):
    for p, M, kind in NO_DEADLOCK:
        specs = stages(p)
        check_values(pipeline(impl, seed + p * 10 + M, specs, M, kind=kind), seed + p * 10 + M, specs, M, 2, kind)


# ----------------------------------------------------------------------------- Part C: memory

MEMORY = {"p4-M8": (4, 8), "p3-M2-fewer-microbatches": (3, 2), "p2-M5": (2, 5)}


@pytest.mark.part("C")
@pytest.mark.points(3)
@pytest.mark.parametrize("p, M", list(MEMORY.values()), ids=list(MEMORY))
def test_1f1b_stage_s_holds_at_most_p_minus_s_microbatches(p, M, impl, seed):
    specs = stages(p)
    res = pipeline(impl, seed, specs, M, kind="1f1b")
    check_values(res, seed, specs, M, 2, "1f1b")
    for s, r in enumerate(res):
        st = r["stats"]
        assert st["rows"] == [2] * M, f"p={p}, M={M}, stage {s}: stage_module called with {st['rows']} rows: once " \
                                      "per microbatch (concatenating them holds every activation at once)"
        assert st["peak_held"] <= min(p - s, M), (
            f"1f1b, p={p}, M={M}, stage {s}: up to {st['peak_held']} microbatches held saved activations at once, "
            f"1F1B allows p - s = {p - s}: free each microbatch's graph with its backward (pop its output and input; "
            "no retain_graph) and run the schedule's warm-up of exactly min(p - s - 1, M) forwards")
        assert st["held"] == 0, f"p={p}, M={M}, stage {s}: {st['held']} microbatch(es) still hold saved tensors " \
                                "after the call: keep no graph after a microbatch's backward"


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_gpipe_holds_all_microbatches_at_its_peak(impl, seed):
    p, M = 3, 4
    specs = stages(p)
    res = pipeline(impl, seed, specs, M, kind="gpipe")
    check_values(res, seed, specs, M, 2, "gpipe")
    for s, r in enumerate(res):
        st = r["stats"]
        assert st["peak_held"] == M and st["held"] == 0, (
            f"gpipe, p={p}, M={M}, stage {s}: peak {st['peak_held']} microbatches held, {st['held']} after the call: "
            f"GPipe runs every forward first (all {M} held at the peak), then frees each with its backward")


@pytest.mark.part("B")
def test_no_pipelining_library(impl):
    src = source(impl)
    for bad in ("torch.distributed.pipelining", "pipelining import", "import pipelining"):
        assert bad not in src, f"the submission uses {bad.split()[0]}: build the schedule and messages yourself"
