"""Hidden graders of lab 09, pipeline parallelism (GPipe and 1F1B, the lab 09 contract).

Part A compares ``schedule`` action by action, for p in 1..4 and M in 1..8, with the
contract's lists built here, and ``bubble_fraction`` with ``(p-1)/(M+p-1)``.

Parts B and C run ``run_pipeline`` on p spawned gloo ranks, one stage each: a trusted
``TrainNet`` stage built on the rank with ``watch`` on, which logs every call (its input
rows, the order of forward calls and backward starts) and counts the calls that hold
tensors autograd saved (``saved_tensors_hooks``: from the first tensor saved in a call
until autograd frees its last). Stage 0 gets the real microbatches, the later stages
NaN-filled tensors of the shape they receive. ``torch.distributed.pipelining`` raises in
every call. The parent chains the stages in float64 on ``torch.cat(microbatches)``.

One property per test, a deviation charged once: only the value test compares the mean loss
and the gradients (atol = rtol = 1e-5); the gradient-accumulation tests compare gradients up
to one positive factor; every other test first checks that the pipeline ran (gradients equal
to the model's up to a positive factor per stage, on M identical microbatches), then grades
its own evidence: the order each stage ran, the messages (every collective except
``barrier`` raises in the point-to-point test only), the groups, the saved activations
against the order run, completion within the watchdog (a run past it is a deadlock).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.toolkit import (DATA_COLLECTIVES, assert_close, imported_names, param_grads, run_ranks, source,
                             train_net)

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
    if any(isinstance(a, tuple) and len(a) == 2 and isinstance(a[1], int) and not 0 <= a[1] < M for a in got):
        return f"a microbatch outside 0..{M - 1}: is the warm-up not capped at M (w = min(p - s - 1, M))?"
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


BAD = [  # (function, refused arguments, their valid neighbour, words the message names)
    ("schedule", ("interleaved", 3, 5, 1), ("1f1b", 3, 5, 1), ["kind", "interleaved"]),
    ("schedule", ("gpipe", 0, 2, 0), ("gpipe", 1, 2, 0), ["num_stages", "0"]),
    ("schedule", ("1f1b", 2, 0, 1), ("1f1b", 2, 1, 1), ["num_microbatches", "0"]),
    ("schedule", ("1f1b", 3, 2, 3), ("1f1b", 3, 2, 2), ["stage", "3"]),
    ("schedule", ("gpipe", 3, 2, -1), ("gpipe", 3, 2, 0), ["stage", "-1"]),
    ("bubble_fraction", (0, 4), (1, 4), ["num_stages", "0"]),
    ("bubble_fraction", (2, -1), (2, 3), ["num_microbatches", "-1"]),
]


def well_formed(name, args, got):
    """The valid neighbour's answer is accepted and has the right form: for ``schedule`` each
    microbatch's F and B once, F first; for ``bubble_fraction`` a float in [0, 1). (Their exact
    values are graded by test_schedule_action_by_action and test_bubble_fraction, not again here.)"""
    if name == "bubble_fraction":
        return isinstance(got, float) and 0 <= got < 1
    M = args[2]
    acts = as_actions(got)
    want = [(a, m) for a in "FB" for m in range(M)]
    return len(acts) == 2 * M and all(acts.count(x) == 1 for x in want) and \
        all(acts.index(("F", m)) < acts.index(("B", m)) for m in range(M))


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_bad_arguments_raise_value_error_naming_them(impl):
    """Each refusal counts only beside its valid neighbour (the one offending argument made valid),
    which must be accepted: a function that always raises earns nothing here."""
    for name, args, ok, words in BAD:
        got = getattr(impl, name)(*ok)
        assert well_formed(name, ok, got), f"{name}{ok} = {got!r}: the valid neighbour of the refused {name}{args} " \
                                           "must be accepted and give " + \
            ("a float in [0, 1)" if name == "bubble_fraction" else "each microbatch's F and B once, F first")
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
#
# Each test grades one property. Only test_loss_and_gradients_equal_one_process grades the
# values (the mean loss, gradients of the mean). The other tests first check that the pipeline
# really ran (``check_ran``: every stage's gradients are the model's up to one positive factor
# per stage), on M identical microbatches, so that neither the loss's 1/M nor how the M parts
# add up can matter there; then they grade their own evidence: the order a stage ran, the
# messages, the groups, the saved activations, completion within the watchdog.

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


def data(seed, specs, M, rows, loss, same=False):
    """M microbatches and targets; ``same``: M copies of one (the parts of the microbatches are then equal)."""
    g = torch.Generator().manual_seed((seed * 7 + 3) % 2**63)
    d_in = specs[0]["layers"][0]["in"] if specs[0]["layers"] else 5
    out = specs[-1]["layers"][-1]["out"] if specs[-1]["layers"] else d_in
    n = 1 if same else M
    xs = [torch.randn(rows, d_in, generator=g) for _ in range(n)]
    if loss == "cross_entropy":
        ts = [torch.randint(0, out, (rows,), generator=g) for _ in range(n)]
    else:
        ts = [torch.randn(rows, out, generator=g) for _ in range(n)]
    if same:
        xs, ts = [xs[0].clone() for _ in range(M)], [ts[0].clone() for _ in range(M)]
    return xs, ts


def width_at(specs, s, d_in=5):
    """Rows' width of the activation stage s receives."""
    for spec in specs[:s]:
        if spec["layers"]:
            d_in = spec["layers"][-1]["out"]
    return d_in


def preseed(spec, rows, d_in):
    """The input and grad_output of one backward run before the pipeline (gradients must add)."""
    d_out = spec["layers"][-1]["out"] if spec["layers"] else d_in
    return torch.linspace(-1, 1, rows * d_in).view(rows, d_in), torch.full((rows, d_out), 0.5)


GROUP_SEED = 7919  # pipeline i of a layout draws its weights and data from seed + GROUP_SEED * i


def body_pipeline(rk, seed, specs, M, rows, kind, loss, members=None, seeded=False, same=False, p2p=False):
    """Drives one stage: builds its watched TrainNet, runs run_pipeline (``p2p``: with every
    collective raising and logged), returns the loss, the gradients and what the stage saw."""
    group, stage, p = None, rk.rank, len(specs)
    if members is not None:
        groups = rk.new_groups(members)  # every rank, the same lists
        i = next((i for i, m in enumerate(members) if rk.rank in m), None)
        if i is None:
            return None  # outside every group: does not call run_pipeline
        group, stage, seed = groups[i], sorted(members[i]).index(rk.rank), seed + GROUP_SEED * i
    spec = specs[stage]
    model = rk.build_model(spec, init_state(seed + stage, spec))
    xs, ts = data(seed, specs, M, rows, loss, same)
    if stage:  # later stages: NaN-filled tensors of the shape they receive
        xs = [torch.full((rows, width_at(specs, stage, xs[0].shape[1])), float("nan")) for _ in range(M)]
    fn = rk.torch_function(f"torch.nn.functional.{loss}")
    if seeded and spec["layers"]:
        x0, g0 = preseed(spec, rows, width_at(specs, stage))
        rk.backward(model, model, x0, grad_output=g0)
    rk.stage_stats(model, reset=True)
    c = rk.call(rk.impl.run_pipeline, model, stage, p, xs, ts, fn, kind=kind, group=group,
                forbid_collectives=FORBIDDEN if p2p else (), forbid=PIPELINING, c10d=p2p)
    changed = [m for m, (a, b) in enumerate(zip(c.args[3], xs)) if not torch.equal(a, b) and
               not (a.isnan().all() and b.isnan().all())]
    return {"loss": c.out, "grads": param_grads(model), "stats": rk.stage_stats(model), "comm": c.comm,
            "changed": changed}


def pipeline(impl, seed, specs, M, rows=2, kind="1f1b", loss="mse_loss", members=None, **kw):
    W = len(specs) if members is None else sum(len(m) for m in members)
    return run_ranks(body_pipeline, W, seed, specs, M, rows, kind, loss, members, impl=impl, timeout=T, **kw)


def model64(seed, specs):
    return [{k: v.double().clone().requires_grad_(k != "scale") for k, v in init_state(seed + s, spec).items()}
            for s, spec in enumerate(specs)]


def grads_of(params):
    return [{k: v.grad for k, v in pr.items() if k != "scale"} for pr in params]


def mean_loss(params, specs, xs, ts, loss):
    """The whole model on torch.cat(xs), the mean over the microbatches of loss_fn(out_m, targets[m])."""
    h = torch.cat(xs)
    for spec, pr in zip(specs, params):
        h = train_net(pr, spec, h)
    per = [F.cross_entropy(o, t) if loss == "cross_entropy" else F.mse_loss(o, t.double())
           for o, t in zip(h.split(xs[0].shape[0]), ts)]
    return sum(per) / len(xs)


def oracle(seed, specs, M, rows, loss, same=False):
    """Float64: the whole model's mean loss on the concatenated batch and every parameter's gradient."""
    xs, ts = data(seed, specs, M, rows, loss, same)
    params = model64(seed, specs)
    L = mean_loss(params, specs, xs, ts, loss)
    L.backward()
    return L.detach(), grads_of(params)


def microbatch_grads(seed, specs, M, rows, loss):
    """Per microbatch m: every stage's gradient of L_m / M alone (to name a gradient that lost parts)."""
    xs, ts = data(seed, specs, M, rows, loss)
    out = []
    for m in range(M):
        params = model64(seed, specs)
        (mean_loss(params, specs, [xs[m]], [ts[m]], loss) / M).backward()
        out.append(grads_of(params))
    return out


def preseed_grads(seed, specs, s, rows):
    """The gradients of stage ``s``'s backward run before the call, alone."""
    pr = model64(seed, specs)[s]
    x0, g0 = preseed(specs[s], rows, width_at(specs, s))
    (train_net(pr, specs[s], x0) * g0.double()).sum().backward()
    return {k: v.grad for k, v in pr.items() if k != "scale"}


def factor(got, want, base=None):
    """The one c > 0 with ``got - base == c * want`` for every parameter of a stage (float32
    tolerances), else None."""
    if any(got.get(n) is None for n in want):
        return None
    g = [got[n].double() - (base[n] if base else 0) for n in want]
    w = list(want.values())
    ww = sum(float((b * b).sum()) for b in w)
    c = sum(float((a * b).sum()) for a, b in zip(g, w)) / ww if ww else float("nan")
    if not (math.isfinite(c) and c > 0):
        return None
    return c if all(torch.allclose(a, c * b, atol=ATOL * max(1.0, c), rtol=RTOL) for a, b in zip(g, w)) else None


def one_microbatch(got, seed, specs, s, M, rows, loss):
    """The microbatch m whose part alone (up to a factor) is stage s's gradient, else None."""
    parts = microbatch_grads(seed, specs, M, rows, loss)
    return next((m for m in range(M) if factor(got, parts[m][s]) is not None), None)


def check_values(results, seed, specs, M, rows, kind, loss="mse_loss"):
    """The values: the last stage's mean loss and every stage's gradients equal the oracle's."""
    L, grads = oracle(seed, specs, M, rows, loss)
    p = len(specs)
    for s, res in enumerate(results):
        case = f"{kind}, p={p}, M={M}, stage {s}"
        if s == p - 1:
            got = res["loss"]
            if not isinstance(got, torch.Tensor) or got.dim() != 0:
                raise AssertionError(f"{case}: the last stage returned {type(got).__name__} "
                                     f"{tuple(getattr(got, 'shape', ()))}, expected a 0-dim tensor (the mean loss)")
            if M > 1 and abs(float(got) - float(L) * M) < 1e-5 * max(1.0, abs(float(L) * M)):
                raise AssertionError(f"{case}: the returned loss is the sum over the microbatches instead of the "
                                     f"mean: divide each L_m by M (the gradients too)")
            assert_close(got, L, atol=ATOL, rtol=RTOL, what="the returned mean loss", case=case)
        else:
            assert res["loss"] is None, f"{case}: a stage other than the last returned {res['loss']!r}, expected None"
        for name, want in grads[s].items():
            g = res["grads"].get(name)
            if g is None:
                raise AssertionError(f"{case}: {name} has no gradient after the call")
            if torch.allclose(g.double(), want, atol=ATOL, rtol=RTOL):
                continue
            if M > 1 and torch.allclose(g.double(), want * M, atol=ATOL * M, rtol=RTOL):
                raise AssertionError(f"{case}: the gradient of {name} is M={M} times the mean loss's: the sum over "
                                     "the microbatches instead of the mean (backpropagate L_m / M)")
            m = one_microbatch(res["grads"], seed, specs, s, M, rows, loss) if M > 1 else None
            if m is not None:
                raise AssertionError(f"{case}: .grad holds microbatch {m}'s part only: .grad was wiped between "
                                     f"microbatches; the {M} backwards must add up in .grad")
            assert_close(g, want, atol=ATOL, rtol=RTOL, what=f"gradient of {name}", case=case)


def check_ran(results, seed, specs, M, rows, kind, loss="mse_loss", ranks=None, same=True):
    """The gate of every test that grades something other than the values: the pipeline really
    ran, each stage's gradients are the model's up to one positive factor (the values themselves,
    and with them the loss's 1/M, are graded by test_loss_and_gradients_equal_one_process)."""
    _, grads = oracle(seed, specs, M, rows, loss, same)
    p = len(specs)
    for s, r in enumerate(ranks or range(p)):
        got = results[r]["grads"]
        case = f"{kind}, p={p}, M={M}, stage {s}"
        if not grads[s]:
            continue  # no parameters: what it relays shows in the stages before it
        missing = [n for n in grads[s] if got.get(n) is None]
        assert not missing, f"{case}: {missing[0]} has no gradient after the call: stage {s} never backpropagated"
        if factor(got, grads[s]) is None:
            detail = ""
            for n, want in grads[s].items():
                try:
                    assert_close(got[n], want, atol=ATOL, rtol=RTOL, what=f"gradient of {n}", case=case)
                except AssertionError as e:
                    detail = str(e)
                    break
            raise AssertionError(f"{case}: the gradients are not the model's, even up to a positive factor: the "
                                 "activations did not reach the next stage intact or the gradients did not come "
                                 f"back (this test grades another property; it counts only on a pipeline that ran). "
                                 f"{detail}")


# --- the values

CASES = {"1f1b-p2-M4": (2, 4, "1f1b", "mse_loss"), "1f1b-p3-M2-fewer-microbatches": (3, 2, "1f1b", "mse_loss"),
         "1f1b-p4-M8": (4, 8, "1f1b", "mse_loss"), "1f1b-p1-M3": (1, 3, "1f1b", "mse_loss"),
         "gpipe-p4-M3": (4, 3, "gpipe", "mse_loss"), "gpipe-p3-M5": (3, 5, "gpipe", "mse_loss"),
         "1f1b-p3-M4-cross-entropy": (3, 4, "1f1b", "cross_entropy")}


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("p, M, kind, loss", list(CASES.values()), ids=list(CASES))
def test_loss_and_gradients_equal_one_process(p, M, kind, loss, impl, seed):
    specs = stages(p)
    check_values(pipeline(impl, seed, specs, M, kind=kind, loss=loss), seed, specs, M, 2, kind, loss)


# --- gradients add in .grad (the pitfall of NVIDIA-NeMo/Automodel#3530), graded up to the loss's factor

@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("kind", KINDS)
def test_gradients_add_to_what_grad_held_before_the_call(kind, impl, seed):
    """Every .grad holds a gradient before the call; after it, .grad minus that is the pipeline's
    gradient (up to one positive factor: the loss's scale is graded by the value test)."""
    p, M = 3, 3
    specs = stages(p)
    res = pipeline(impl, seed, specs, M, kind=kind, seeded=True, same=True)
    _, grads = oracle(seed, specs, M, 2, "mse_loss", same=True)
    for s, r in enumerate(res):
        case = f"{kind}, p={p}, M={M}, stage {s}"
        before = preseed_grads(seed, specs, s, 2)
        if factor(r["grads"], grads[s], base=before) is None:
            if factor(r["grads"], grads[s]) is not None:
                raise AssertionError(f"{case}: the gradients lost what .grad held before the call: .grad was wiped "
                                     "(no zero_grad or grad = None in run_pipeline: gradients add to .grad as "
                                     "backward() does)")
            check_ran(res, seed, specs, M, 2, kind)
            raise AssertionError(f"{case}: .grad after the call is not what it held before plus the pipeline's "
                                 "gradient: gradients add to .grad as backward() does")


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("kind", KINDS)
def test_every_microbatch_adds_to_the_gradient(kind, impl, seed):
    """The silent case (NVIDIA-NeMo/Automodel#3530): .grad wiped between microbatches leaves the
    last microbatch's part only, while the loss looks right. On M different microbatches the
    gradient must be the sum of all M parts (up to one positive factor)."""
    p, M = 3, 4
    specs = stages(p)
    res = pipeline(impl, seed, specs, M, kind=kind)
    _, grads = oracle(seed, specs, M, 2, "mse_loss")
    for s, r in enumerate(res):
        if factor(r["grads"], grads[s]) is None:
            case = f"{kind}, p={p}, M={M}, stage {s}"
            m = one_microbatch(r["grads"], seed, specs, s, M, 2, "mse_loss")
            if m is not None:
                raise AssertionError(f"{case}: .grad holds microbatch {m}'s part only, not the sum of the {M} "
                                     "microbatches': .grad was wiped between microbatches (the loss looks right; "
                                     f"NVIDIA-NeMo/Automodel#3530); the {M} backwards must add up in .grad")
            raise AssertionError(f"{case}: the gradients are not the sum of the {M} microbatches' parts, even up to "
                                 "a positive factor: each microbatch's backward adds its part to .grad")


# --- the other properties, each on its own evidence

@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("kind", KINDS)
def test_a_shape_change_and_a_parameter_free_stage(kind, impl, seed):
    """Stage 0 maps 5 -> 9 features, stage 1 has no parameters (tanh), stage 2 maps 9 -> 4 classes
    (cross-entropy): each stage allocates what it receives from ``microbatches[m].shape``."""
    specs = stages(3, widths=[5, 9, 9, 4], free=(1,))
    res = pipeline(impl, seed, specs, 4, rows=3, kind=kind, loss="cross_entropy", same=True)
    check_ran(res, seed, specs, 4, 3, kind, loss="cross_entropy")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_a_parameter_free_first_stage(impl, seed):
    """Stage 0 has no parameters: its output needs no backward, it still runs its schedule."""
    specs = stages(3, widths=[5, 5, 6, 3], free=(0,))
    check_ran(pipeline(impl, seed, specs, 3, kind="1f1b", same=True), seed, specs, 3, 2, "1f1b")


@pytest.mark.part("B")
@pytest.mark.points(1)
@pytest.mark.parametrize("kind", KINDS)
def test_the_callers_microbatches_are_not_written(kind, impl, seed):
    p, M = 3, 3
    specs = stages(p)
    res = pipeline(impl, seed, specs, M, kind=kind, same=True)
    check_ran(res, seed, specs, M, 2, kind)
    for s, r in enumerate(res):
        assert not r["changed"], f"{kind}, p={p}, M={M}, stage {s}: run_pipeline wrote into microbatches " \
                                 f"{r['changed']}: the caller's tensors are inputs (receive into new buffers)"


def check_schedule_ran(results, specs, M, rows, kind):
    p = len(specs)
    for s, r in enumerate(results):
        st = r["stats"]
        case = f"{kind}, p={p}, M={M}, stage {s}"
        assert st["rows"] == [rows] * M, (
            f"{case}: stage_module was called {len(st['rows'])} time(s) with {st['rows']} rows: once per microbatch "
            f"per forward, with its {rows} rows (no concatenation, no recomputation)")
        got = [(a, m) for a, m in st["actions"]]
        want = want_schedule(kind, p, M, s)
        if got != want:
            why = diagnose_schedule(kind, p, M, s, got)
            raise AssertionError(f"{case}: the stage did not run its schedule (forward calls and backward starts, "
                                 f"in order):\n  ran      {got}\n  expected {want}" + (f"\n  ({why})" if why else ""))


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("kind", KINDS)
def test_each_stage_executes_its_schedule(kind, impl, seed):
    specs = stages(4)
    res = pipeline(impl, seed, specs, 6, kind=kind, same=True)
    check_ran(res, seed, specs, 6, 2, kind)
    check_schedule_ran(res, specs, 6, 2, kind)


@pytest.mark.part("B")
@pytest.mark.points(1)
@pytest.mark.parametrize("kind", KINDS)
def test_only_point_to_point_messages_each_received_in_the_call(kind, impl, seed):
    """Every collective raises here (barrier allowed) and every dispatcher op is logged; the
    other tests let a collective run (this one grades it)."""
    p, M = 3, 5
    specs = stages(p)
    res = pipeline(impl, seed, specs, M, kind=kind, same=True, p2p=True)
    check_ran(res, seed, specs, M, 2, kind)
    sent = recv = 0
    for s, r in enumerate(res):
        ops = [e.get("op") for e in r["comm"]["events"] if e["k"] == "c10d"]
        other = sorted({op for op in ops if op not in P2P_OPS and op != "barrier"})
        assert not other, f"stage {s} called {', '.join(other)}: the contract forbids collectives here " \
                          "(point-to-point send/recv only; barrier allowed)"
        sent += r["comm"]["sent_msgs"]
        recv += r["comm"]["recv_msgs"]
    assert sent == recv, f"{sent} messages sent and {recv} received by the stages in one call: every message a call " \
                         "sends is received within that call"


GROUPS = {"blocks-01-23": [[0, 1], [2, 3]], "interleaved-02-13": [[0, 2], [1, 3]]}


@pytest.mark.part("B")
@pytest.mark.points(1)
@pytest.mark.parametrize("members", list(GROUPS.values()), ids=list(GROUPS))
def test_group_is_honoured(members, impl, seed):
    """W=4 as two pipelines of 2 stages (stage = rank in the group, groups ordered by global
    rank), each with its own weights and data."""
    specs = stages(2)
    try:
        res = pipeline(impl, seed, specs, 3, kind="1f1b", members=members, same=True)
        for i, m in enumerate(members):
            check_ran(res, seed + GROUP_SEED * i, specs, 3, 2, "1f1b", ranks=sorted(m))
    except AssertionError as e:  # a wrong result, a deadlock (RankTimeout) or a rank's error (RankError)
        raise AssertionError(f"groups {members} of W=4: {e} (neighbours are group ranks stage +- 1: send to "
                             "dist.get_global_rank(group, stage + 1))") from None


def body_refusals(rk, seed, refused):
    """A valid call (2 stages, M=2) first, then each refused one: (stage per rank, num_stages, M)."""
    specs = stages(2)
    model = rk.build_model(specs[rk.rank], init_state(seed + rk.rank, specs[rk.rank]))
    fn = rk.torch_function("torch.nn.functional.mse_loss")
    xs, ts = data(seed, specs, 2, 2, "mse_loss", same=True)
    if rk.rank:
        xs = [torch.full((2, width_at(specs, 1)), float("nan")) for _ in xs]
    rk.call(rk.impl.run_pipeline, model, rk.rank, 2, xs, ts, fn, kind="1f1b", forbid=PIPELINING)
    out = {"grads": param_grads(model), "refused": []}
    for stage_of, p, M in refused:
        try:
            rk.call(rk.impl.run_pipeline, model, stage_of[rk.rank], p, xs[:M], ts[:M], fn, forbid=PIPELINING)
            out["refused"].append({"error": "no error"})
        except Exception as e:  # noqa: BLE001 - the type is graded
            out["refused"].append({"error": type(e).__name__, "msg": str(e)})
    return out


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_wrong_stage_or_size_raises_before_any_message(impl, seed):
    """Each refusal counts only beside the valid call it neighbours (num_stages = 2, stages in
    rank order, M = 2), which must run the pipeline."""
    refused = [([0, 1], 3, 1, "num_stages=3 in a group of 2"), ([1, 0], 2, 1, "stages swapped"),
               ([0, 1], 2, 0, "microbatches=[]")]
    res = run_ranks(body_refusals, 2, seed, [c[:3] for c in refused], impl=impl, timeout=T)
    check_ran(res, seed, stages(2), 2, 2, "1f1b")
    for i, (_, _, _, what) in enumerate(refused):
        for r, out in enumerate(res):
            got = out["refused"][i]
            assert got["error"] == "ValueError", f"{what}: rank {r} got {got['error']} {got.get('msg', '')[:200]}, " \
                                                 "expected ValueError before any message"


NO_DEADLOCK = [(p, M, kind) for kind in KINDS for p in (2, 3, 4) for M in (1, 2, 3, 7) if kind == "1f1b" or M in (1, 3)]


@pytest.mark.part("B")
@pytest.mark.points(3)
def test_no_deadlock_for_any_stage_count_and_microbatch_count(impl, seed):
    for p, M, kind in NO_DEADLOCK:
        specs, sd = stages(p), seed + p * 10 + M
        check_ran(pipeline(impl, sd, specs, M, kind=kind, same=True), sd, specs, M, 2, kind)


@pytest.mark.part("B")
def test_no_pipelining_library(impl, seed):
    """Counts beside a pipeline that ran (a module that implements nothing uses no library either)."""
    specs = stages(2)
    check_ran(pipeline(impl, seed, specs, 2, kind="gpipe", same=True), seed, specs, 2, 2, "gpipe")
    bad = sorted(n for n in imported_names(source(impl)) if "pipelining" in n.split("."))
    assert not bad, f"the submission uses {bad[0]}: torch.distributed.pipelining must not be used; build the " \
                    "schedule and messages yourself"


# ----------------------------------------------------------------------------- Part C: memory
#
# Which microbatches a stage must hold follows from the order it ran (graded in Part A and by
# test_each_stage_executes_its_schedule): under 1F1B's order min(p - s, M), under GPipe's M.
# Part C grades what run_pipeline keeps alive on top of that order: one stage_module call per
# microbatch with its rows, each microbatch's saved activations freed with its backward, none after.

def most_in_flight(actions):
    """The most microbatches between their forward call and their backward start, in the order run."""
    live = peak = 0
    for a, _ in actions:
        live += 1 if a == "F" else -1
        peak = max(peak, live)
    return peak


def check_memory(results, p, M, rows, kind):
    for s, r in enumerate(results):
        st = r["stats"]
        case = f"{kind}, p={p}, M={M}, stage {s}"
        assert st["rows"] == [rows] * M, f"{case}: stage_module called with {st['rows']} rows: once per microbatch " \
                                         "with its rows (no concatenation, no recomputation)"
        allowed = most_in_flight(st["actions"])
        assert st["peak_held"] <= allowed, (
            f"{case}: up to {st['peak_held']} microbatches held saved activations at once, while the order the stage "
            f"ran has at most {allowed} between a forward and its backward: a microbatch's graph is kept after its "
            "backward (retain_graph=True, or its output or input kept): drop both at B(m)")
        assert st["held"] == 0, f"{case}: {st['held']} microbatch(es) still hold saved tensors after the call: a " \
                                "microbatch's graph is kept after its backward"


MEMORY = {"p4-M8": (4, 8), "p3-M2-fewer-microbatches": (3, 2), "p2-M5": (2, 5)}


@pytest.mark.part("C")
@pytest.mark.points(3)
@pytest.mark.parametrize("p, M", list(MEMORY.values()), ids=list(MEMORY))
def test_1f1b_frees_each_microbatch_with_its_backward(p, M, impl, seed):
    specs = stages(p)
    res = pipeline(impl, seed, specs, M, kind="1f1b", same=True)
    check_ran(res, seed, specs, M, 2, "1f1b")
    check_memory(res, p, M, 2, "1f1b")


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_gpipe_frees_each_microbatch_with_its_backward(impl, seed):
    p, M = 3, 4
    specs = stages(p)
    res = pipeline(impl, seed, specs, M, kind="gpipe", same=True)
    check_ran(res, seed, specs, M, 2, "gpipe")
    check_memory(res, p, M, 2, "gpipe")
