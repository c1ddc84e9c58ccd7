"""Visible tests of lab 09 (a subset of what the hidden graders check).

Part A calls your `schedule` and `bubble_fraction` directly. Parts B and C run p gloo ranks
through run_ranks, one stage per rank. `body_step` drives one rank: `rk.build_model(spec,
state)` builds the course's TrainNet stage there (Linear layers with tanh between them; an
empty "layers" list is a parameter-free stage computing tanh; "watch" records what the stage
saw), `rk.torch_function("torch.nn.functional.mse_loss")` is the loss handed to your code,
`rk.call(rk.impl.run_pipeline, ...)` runs your pipeline step with every collective
forbidden (`.out` is its return value), `rk.stage_stats(model)` is what the stage saw
(`rows` of each call's input, `actions` ["F", call] / ["B", call] in order, `peak_held`:
the most calls holding saved activations at once, `held`: now) and `param_grads(model)`
its gradients. A stage s > 0 gets NaN-filled microbatches of the shape it receives. The
oracle is one process chaining all the stages' TrainNets in float64 (each rounds its output
to float32, as TrainNet does) on the concatenated batch, loss = the mean over the
microbatches of mse_loss(out_m, target_m). Run: pytest labs/09
"""
import pytest
import torch

from harness.toolkit import DATA_COLLECTIVES, TrainNet, expect_raises, param_grads, run_ranks

TOL = dict(atol=1e-5, rtol=1e-5)


def layer(name, n_in, n_out):
    return {"name": name, "in": n_in, "out": n_out, "bias": True, "dtype": "float32", "frozen": False}


def F(m):
    return ("F", m)


def B(m):
    return ("B", m)


def as_actions(lst):
    return [(str(a), int(m)) for a, m in lst]


# --- Part A: schedules as data ---------------------------------------------------------------

@pytest.mark.part("A")
def test_gpipe_schedule_all_forwards_then_backwards_in_reverse(impl):
    want = [F(0), F(1), F(2), F(3), B(3), B(2), B(1), B(0)]
    for s in range(3):
        got = as_actions(impl.schedule("gpipe", 3, 4, s))
        assert got == want, f"schedule('gpipe', 3, 4, {s}) = {got}, expected {want}"


ONE_F_ONE_B = {  # (p, M, s): the list; w = min(p - s - 1, M) warm-up forwards
    (3, 4, 0): [F(0), F(1), F(2), B(0), F(3), B(1), B(2), B(3)],   # w = 2
    (3, 4, 1): [F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)],   # w = 1
    (3, 4, 2): [F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)],   # w = 0: the last stage alternates
    (4, 2, 0): [F(0), F(1), B(0), B(1)],                           # M < p: w = min(3, 2) = 2
    (4, 2, 2): [F(0), F(1), B(0), B(1)],                           # w = 1
    (4, 2, 3): [F(0), B(0), F(1), B(1)],                           # w = 0
    (1, 3, 0): [F(0), B(0), F(1), B(1), F(2), B(2)],               # one stage
}


@pytest.mark.part("A")
def test_1f1b_schedule_warm_up_steady_state_cool_down(impl):
    for (p, M, s), want in ONE_F_ONE_B.items():
        got = as_actions(impl.schedule("1f1b", p, M, s))
        assert got == want, f"schedule('1f1b', {p}, {M}, {s}) = {got}, expected {want} (w = {min(p - s - 1, M)})"


@pytest.mark.part("A")
def test_bubble_fraction_and_bad_arguments(impl):
    for p, M, want in ((4, 8, 3 / 11), (3, 4, 2 / 6), (1, 5, 0.0), (4, 1, 3 / 4)):
        got = impl.bubble_fraction(p, M)
        assert got == pytest.approx(want, abs=1e-12), (
            f"bubble_fraction({p}, {M}) = {got}, expected (p - 1) / (M + p - 1) = {want}")
    err = expect_raises(ValueError, "schedule('1f1b', 3, 4, stage=3): stage must be in [0, 3)",
                        impl.schedule, "1f1b", 3, 4, 3)
    assert "stage" in str(err) and "3" in str(err), f"the ValueError must name stage and its value 3, got {err}"
    err = expect_raises(ValueError, "schedule('zb', 2, 2, 0): kind must be 'gpipe' or '1f1b'",
                        impl.schedule, "zb", 2, 2, 0)
    assert "kind" in str(err) and "zb" in str(err), f"the ValueError must name kind and its value 'zb', got {err}"
    err = expect_raises(ValueError, "bubble_fraction(2, 0): num_microbatches must be >= 1",
                        impl.bubble_fraction, 2, 0)
    assert "num_microbatches" in str(err), f"the ValueError must name num_microbatches, got {err}"


# --- Parts B and C: a pipeline of TrainNet stages ------------------------------------------

def make_case(specs, M, rows, seed):
    """Every stage's initial state, the M real microbatches and targets, and what each stage
    is given as `microbatches` (stage 0 the real ones, stage s > 0 NaN-filled tensors of the
    shape of the activation it receives)."""
    states = []
    with torch.random.fork_rng():
        for s, spec in enumerate(specs):
            torch.manual_seed(seed + s)
            states.append(dict(TrainNet(spec).state_dict()))
    gen = torch.Generator().manual_seed(seed + 100)
    n_in = specs[0]["layers"][0]["in"]
    n_out = next(sp["layers"][-1]["out"] for sp in reversed(specs) if sp["layers"])
    xs = [torch.randn(rows, n_in, generator=gen) for _ in range(M)]
    ys = [torch.randn(rows, n_out, generator=gen) for _ in range(M)]
    given, width = [xs], n_in
    for spec in specs[:-1]:
        width = spec["layers"][-1]["out"] if spec["layers"] else width
        given.append([torch.full((rows, width), float("nan")) for _ in range(M)])
    return states, xs, ys, given


def body_step(rk, specs, states, given, targets, kinds):
    s, p = rk.rank, rk.world_size
    model = rk.build_model(specs[s], states[s])
    loss = rk.torch_function("torch.nn.functional.mse_loss")
    out = []
    for kind in kinds:
        rk.stage_stats(model, reset=True)
        c = rk.call(rk.impl.run_pipeline, model, s, p, given[s], targets, loss, kind=kind,
                    forbid_collectives=list(DATA_COLLECTIVES))
        out.append({"loss": c.out, "stats": rk.stage_stats(model), "grads": param_grads(model)})
    return out


def oracle(specs, states, xs, ys):
    """The whole model in float64 on one process: the mean loss and every stage's gradients."""
    nets = []
    for spec, state in zip(specs, states):
        net = TrainNet(spec)
        net.load_state_dict(state)
        nets.append(net.double())
    h = torch.cat(xs).double()
    for net in nets:
        h = net(h)
    outs = h.split([x.shape[0] for x in xs])
    loss = sum(torch.nn.functional.mse_loss(o, y.double()) for o, y in zip(outs, ys)) / len(xs)
    loss.backward()
    return loss.detach(), [{n: q.grad for n, q in net.named_parameters()} for net in nets]


def check_step(res, specs, states, xs, ys, kind):
    p = len(specs)
    want_loss, want_grads = oracle(specs, states, xs, ys)
    for s in range(p):
        got = res[s][0]
        if s < p - 1:
            assert got["loss"] is None, (
                f"stage {s} of {p} ({kind}): only the last stage returns the loss, got {got['loss']}")
        else:
            assert isinstance(got["loss"], torch.Tensor) and got["loss"].dim() == 0, (
                f"the last stage ({kind}) must return a 0-dim tensor, got {got['loss']!r}")
            torch.testing.assert_close(got["loss"].double(), want_loss, **TOL, msg=lambda m: (
                f"the last stage's loss ({kind}) must be the mean over the microbatches of L_m\n{m}"))
        for name, exp in want_grads[s].items():
            g = got["grads"].get(name)
            assert g is not None, f"stage {s} ({kind}): {name} has no gradient"
            torch.testing.assert_close(g.double(), exp, **TOL, msg=lambda m: (
                f"stage {s} ({kind}): the gradient of {name} differs from one process on the concatenated batch "
                f"(the mean loss over the M microbatches)\n{m}"))


@pytest.mark.part("B")
def test_1f1b_two_stages_match_one_process(impl):
    specs = [{"layers": [layer("a", 4, 6), layer("b", 6, 5)], "watch": True},
             {"layers": [layer("c", 5, 3)], "watch": True}]
    M, rows = 3, 2
    states, xs, ys, given = make_case(specs, M, rows, seed=901)
    res = run_ranks(body_step, 2, specs, states, given, ys, ["1f1b"], impl=impl, timeout=60)
    check_step(res, specs, states, xs, ys, "1f1b")


@pytest.mark.part("B")
def test_gpipe_three_stages_fewer_microbatches_than_stages(impl):
    # stage 1 has no parameters (tanh): it must still relay activations and gradients
    specs = [{"layers": [layer("a", 4, 6)], "watch": True},
             {"layers": [], "watch": True},
             {"layers": [layer("c", 6, 6), layer("d", 6, 2)], "watch": True}]
    M, rows = 2, 3
    states, xs, ys, given = make_case(specs, M, rows, seed=932)
    res = run_ranks(body_step, 3, specs, states, given, ys, ["gpipe"], impl=impl, timeout=60)
    check_step(res, specs, states, xs, ys, "gpipe")
    for s in range(3):
        acts = as_actions(res[s][0]["stats"]["actions"])
        want = [F(0), F(1), B(1), B(0)]
        assert acts == want, f"stage {s}: the stage saw {acts}, expected the gpipe schedule {want}"


@pytest.mark.part("C")
def test_1f1b_holds_at_most_p_minus_s_microbatches(impl):
    specs = [{"layers": [layer("a", 3, 4)], "watch": True},
             {"layers": [layer("b", 4, 4)], "watch": True},
             {"layers": [layer("c", 4, 2)], "watch": True}]
    p, M, rows = 3, 4, 2
    states, xs, ys, given = make_case(specs, M, rows, seed=977)
    res = run_ranks(body_step, p, specs, states, given, ys, ["1f1b", "gpipe"], impl=impl, timeout=60)
    for s in range(p):
        one, gp = res[s]
        st = one["stats"]
        assert st["rows"] == [rows] * M, (
            f"stage {s} (1f1b): stage_module was called on inputs of {st['rows']} rows, expected one call per "
            f"microbatch with its {rows} rows ({[rows] * M}): no concatenation, no recomputation")
        acts = as_actions(st["actions"])
        want = ONE_F_ONE_B[(p, M, s)]
        assert acts == want, f"stage {s}: the stage saw {acts}, expected schedule('1f1b', {p}, {M}, {s}) = {want}"
        assert st["peak_held"] <= p - s, (
            f"stage {s} (1f1b): {st['peak_held']} microbatches' activations were held at once, at most p - s = "
            f"{p - s} allowed: release each microbatch's graph after its backward")
        assert st["held"] == 0, f"stage {s} (1f1b): {st['held']} microbatches still hold activations after the call"
        assert gp["stats"]["peak_held"] == M, (
            f"stage {s} (gpipe): peak of {gp['stats']['peak_held']} microbatches held, expected all M = {M} "
            "(every forward before the first backward)")
        assert gp["stats"]["held"] == 0, f"stage {s} (gpipe): {gp['stats']['held']} microbatches still held after"
