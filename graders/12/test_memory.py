"""Hidden graders of lab 12, training memory (activation checkpointing and mixed precision).

Parts A and B run the submission's ``checkpoint`` / ``checkpoint_sequential`` in the worker on
trusted functions built there (``RecomputeNet``: linear, activation, dropout, linear; blocks
add their input and keep x's shape), one forward and backward watched by the ``recompute``
probe: the global RNG seeded from the grading seed, numbers drawn between forward and backward
and after it, every storage autograd packs during forward counted through
``saved_tensors_hooks`` (parameters excluded), the tensors that custom autograd nodes keep as
attributes, each module's calls by phase (forward or backward, grad mode, autocast state).
``torch.utils.checkpoint`` (and a submission's own ``saved_tensors_hooks``) raise during the
calls. The oracle is the same probe run here on a direct call of the same function (same
weights, same seed, so the same dropout masks), compared at the contract's float32 tolerance.

Part C drives the submission's ``DynamicLossScaler`` through scripted gradients (finite,
inf, NaN, finite but overflowing once scaled; explicit ``unscale_`` on some steps) and
compares every step decision, scale, parameter and optimizer state with ``torch.amp.GradScaler``
driven here the same way (also below a scale of 1: no floor); ``train_step`` trains a trusted
model in the worker (with torch's GradScaler behind the contract's interface, and once with the
submission's scaler) and is compared with a float64 reference step within the AMP dtype's
tolerance; its returned loss is graded by one test, on steps where the scale grows and backs off.
A refusal (ValueError, TypeError, RuntimeError) is graded only after the same entry point's valid
neighbour is graded on its value.
"""
from __future__ import annotations


import pytest
import torch

from harness.toolkit import (GradScalerAdapter, RecomputeNet, assert_close, build_recompute, checked, drive_scaler,
                             expect_raises, imported_names, recompute, source, tolerance, train_steps)

ATOL = RTOL = 1e-5  # float32 on CPU (the contract's); the oracle runs the same ops in the same order
FORBID = ["torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential",
          "torch.utils.checkpoint.CheckpointFunction"]
REASON = "the contract forbids torch.utils.checkpoint: build the autograd.Function yourself"
FORBIDDEN_MODULES = ("torch.utils.checkpoint",)


# ----------------------------------------------------------------------------- trusted functions

def fn_spec(p=0.3, act="tanh", d_hidden=7):
    return {"d_in": 5, "d_hidden": d_hidden, "d_out": 3, "act": act, "p": p, "residual": False}


def block_spec(p=0.25, d=6):
    return {"d_in": d, "d_hidden": 2 * d, "d_out": d, "act": "tanh", "p": p, "residual": True}


def init_state(seed, spec):
    g = torch.Generator().manual_seed(seed % 2**63)
    state = {}
    for name, (d_in, d_out) in (("inp", (spec["d_in"], spec["d_hidden"])), ("out", (spec["d_hidden"], spec["d_out"]))):
        state[f"{name}.weight"] = torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
        state[f"{name}.bias"] = torch.randn(d_out, generator=g) * 0.1
    return state


def nets(on, specs, seeds):
    """The trusted modules: in the worker (``on`` the implementation) or here (``on`` None)."""
    return build_recompute(on, specs, [init_state(s, sp) for s, sp in zip(seeds, specs)])


def direct(fn, *args):
    """The oracle: ``fn`` called directly."""
    return fn(*args)


def plain(blocks, segments, x):
    """The oracle of checkpoint_sequential: every block in order, nothing checkpointed."""
    for b in blocks:
        x = b(x)
    return x


def gen(seed, salt):
    return torch.Generator().manual_seed((seed * 1009 + salt) % 2**63)


# ----------------------------------------------------------------------------- Part A: checkpoint

# name: (spec, the arguments after fn (from a generator), which of them require grad)
def _args_input(g):
    return (torch.randn(4, 5, generator=g),), (True,)


def _args_non_tensor(g):
    return (torch.randn(4, 5, generator=g), torch.rand(7, generator=g) + 0.5, 0.7, "gelu"), (True, False, False, False)


def _args_int_index(g):
    idx = torch.randint(0, 5, (7,), generator=g)  # rows picked, some twice
    return (torch.randn(5, 5, generator=g), None, 1.3, "relu", idx), (True, False, False, False, False)


def _args_batch(g):
    return (torch.randn(6, 5, generator=g), None, 0.9), (False, False, False)


def _args_two_grads(g):
    return (torch.randn(3, 5, generator=g), torch.randn(3, 7, generator=g)), (True, True)


FN_CASES = {"input-requires-grad": _args_input, "non-tensor-args": _args_non_tensor,
            "int64-index-argument": _args_int_index, "batch-without-grad": _args_batch,
            "two-inputs-require-grad": _args_two_grads}


def run_checkpoint(impl, seed, make, spec, autocast_forward=None, autocast_backward=None):
    """(got, want, case): the submission's checkpoint(fn, *args) and a direct call, each
    forward and backward under the same seed, with the same grad_output."""
    g = gen(seed, 1)
    args, rg = make(g)
    rows = args[4].numel() if len(args) > 4 else args[0].shape[0]
    go = torch.randn(rows, spec["d_out"], generator=g)
    rng_seed = int(torch.randint(0, 2**31, (1,), generator=g))
    common = dict(grad_output=go, requires_grad=(False, *rg), seed=rng_seed, autocast_forward=autocast_forward,
                  autocast_backward=autocast_backward)
    mine = nets(impl, [spec], [seed])
    got = recompute(impl.checkpoint, (mine[0], *args), watch=mine, forbid=FORBID, reason=REASON, **common)
    ref = nets(None, [spec], [seed])
    want = recompute(direct, (ref[0], *args), watch=ref, **common)
    return got, want, args


def check_like_direct(got, want, what, case, hint="", atol=ATOL, rtol=RTOL):
    """Output, argument gradients and parameter gradients equal the oracle's."""
    if got.get("forbidden"):
        raise AssertionError(f"{case}: called {', '.join(got['forbidden'])}: {REASON}")
    borrowed = [f for f in got.get("functions", []) if f.startswith("torch.")]
    if borrowed:
        raise AssertionError(f"{case}: the graph holds torch's own {', '.join(borrowed)}: {REASON}")
    err = got.get("backward_error")
    if err:
        why = ""
        if "does not require grad" in err or "grad_fn" in err:
            why = (" (the output does not require grad: pass an extra empty tensor that requires grad through your "
                   "Function's apply, so that its output requires grad even when no argument does)"
                   if not got.get("grad_fn", {}).get("type") else
                   " (the recomputation built no graph: run fn under torch.enable_grad() in backward, then "
                   "backpropagate through its output)")
        raise AssertionError(f"{case}: backward raised {err}{why}")
    assert_close(got["out"], want["out"], atol=atol, rtol=rtol, what=f"the output of {what}", case=case)
    expected = [w is not None for w in want["grads"]] + [w is not None for wp in want["param_grads"] for w in wp.values()]
    present = [g is not None for g in got["grads"]] + [g is not None for gp in got["param_grads"] for g in gp.values()]
    if any(expected) and not any(p for p, e in zip(present, expected) if e):
        raise AssertionError(f"{case}: no argument and no parameter of fn has a gradient after backward: the "
                             "recomputation built no graph (recomputation under no_grad? rerun fn under "
                             "torch.enable_grad(), then torch.autograd.backward through its output)")
    for i, (g, w) in enumerate(zip(got["grads"], want["grads"])):
        if w is None:
            continue
        if g is None:
            raise AssertionError(f"{case}: argument {i} requires grad but has no gradient after backward: return "
                                 "the recomputed leaves' .grad from backward, one per argument")
        assert_close(g, w, atol=atol, rtol=rtol, what=f"the gradient of argument {i}", case=case + hint)
    for net, (gp, wp) in enumerate(zip(got["param_grads"], want["param_grads"])):
        where = f"block {net}" if len(want["param_grads"]) > 1 else "fn"
        for name, w in wp.items():
            g = gp.get(name)
            if g is None:
                raise AssertionError(
                    f"{case}: parameter {name} of {where} has no gradient after backward: the recomputation built no "
                    "graph (recomputation under no_grad? rerun fn under torch.enable_grad(), then "
                    "torch.autograd.backward through its output)")
            assert_close(g, w, atol=atol, rtol=rtol, what=f"the gradient of parameter {name} of {where}",
                         case=case + hint)


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", list(FN_CASES))
def test_checkpoint_gradients_equal_a_direct_call(case, impl, seed):
    spec = fn_spec(p=0.3, act="tanh")
    got, want, _ = run_checkpoint(impl, seed, FN_CASES[case], spec)
    check_like_direct(got, want, "checkpoint(fn, *args)", case,
                      hint="; fn draws dropout masks: the recomputation must draw the forward's")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_checkpoint_output_is_your_functions_node(impl, seed):
    got, want, _ = run_checkpoint(impl, seed, _args_input, fn_spec())
    check_like_direct(got, want, "checkpoint(fn, x)", "input-requires-grad")
    gf = got["grad_fn"]
    assert gf["custom"], f"the output's grad_fn is {gf['type'] or 'None'}: it must be the node of your " \
                         "torch.autograd.Function (return what YourFunction.apply(...) returns)"
    assert not gf["forward"].startswith("torch."), \
        f"the output's node belongs to {gf['forward']}: build your own autograd.Function ({REASON})"


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", ["input-requires-grad", "int64-index-argument", "batch-without-grad"])
def test_checkpoint_forward_keeps_only_the_tensor_arguments(case, impl, seed):
    got, want, args = run_checkpoint(impl, seed, FN_CASES[case], fn_spec())
    checked(got, lambda v: check_like_direct(v, want, "checkpoint(fn, *args)", case), case=case,
            prop="what forward keeps")
    log = got["logs"][0]
    fwd = [e for e in log if e[0] == "forward"]
    bwd = [e for e in log if e[0] == "backward"]
    assert len(fwd) == 1, f"{case}: fn was called {len(fwd)} times during forward: call it once"
    assert not fwd[0][1], f"{case}: fn ran with grad enabled during forward: it recorded a graph (and autograd kept " \
                          "its activations); run it under torch.no_grad()"
    assert len(bwd) == 1, f"{case}: fn was recomputed {len(bwd)} times during backward: rerun it exactly once"
    allowed = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    assert got["graph_saved_bytes"] <= allowed, (
        f"{case}: when forward returns, the graph holds {got['graph_saved_bytes']} bytes for backward (read from "
        f"its nodes: {', '.join(got['graph_saved'])}); only the tensor arguments ({allowed} bytes) may be saved")
    assert got["packed_bytes"] <= allowed, (
        f"{case}: autograd saved {got['packed_bytes']} bytes during forward ({', '.join(got['packed'])}); only the "
        f"tensor arguments ({allowed} bytes) may be saved: all activations saved anyway (fn must not record a graph, "
        "save_for_backward only the inputs)")
    assert not got["kept"], (
        f"{case}: your Function's ctx keeps {got['kept_bytes']} bytes of other tensors ({'; '.join(got['kept'])}): "
        "ctx keeping the output or intermediates defeats checkpointing; keep only the tensor arguments "
        "(save_for_backward) and recompute the rest")


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_checkpoint_dropout_masks_are_the_forwards(impl, seed):
    """The same function without dropout first (so a failure with dropout is the RNG's)."""
    for p in (0.0, 0.5):
        spec = fn_spec(p=p, d_hidden=16)
        got, want, _ = run_checkpoint(impl, seed, _args_input, spec)
        if p == 0.0:
            check_like_direct(got, want, "checkpoint(fn, x)", "no dropout")
            continue
        try:
            check_like_direct(got, want, "checkpoint(fn, x)", f"dropout p={p}")
        except AssertionError as e:
            raise AssertionError(f"{e}\nwithout dropout the gradients are right, with dropout they are not: the "
                                 "recomputation drew other dropout masks (RNG not restored: set the forward's RNG "
                                 "state, torch.set_rng_state, inside torch.random.fork_rng before rerunning fn)") from None


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_checkpoint_leaves_the_global_rng_as_a_direct_call(impl, seed):
    got, want, _ = run_checkpoint(impl, seed, _args_non_tensor, fn_spec(p=0.4))
    checked(got, lambda v: check_like_direct(v, want, "checkpoint(fn, *args)", "non-tensor-args"),
            prop="the global RNG state")
    assert torch.equal(got["mid"], want["mid"]), (
        "the numbers drawn from the global RNG between forward and backward differ from a direct call's: forward "
        "must draw exactly what fn draws (call fn once, draw nothing else)")
    assert torch.equal(got["after"], want["after"]), (
        "after backward the global RNG state is not what a direct call leaves (global RNG state changed by "
        "backward): recompute inside torch.random.fork_rng, so that setting the forward's state and the rerun's "
        "draws are undone when backward returns")


AUTOCAST = {"forward-bf16": ("bfloat16", None), "forward-fp16-backward-bf16": ("float16", "bfloat16"),
            "backward-fp16-only": (None, "float16")}


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", list(AUTOCAST))
def test_checkpoint_recomputes_under_the_forwards_autocast(case, impl, seed):
    fwd_ac, bwd_ac = AUTOCAST[case]
    got, want, _ = run_checkpoint(impl, seed, _args_non_tensor, fn_spec(p=0.3), autocast_forward=fwd_ac,
                                  autocast_backward=bwd_ac)
    if not got.get("backward_error") and not got.get("forbidden"):
        log = got["logs"][0]
        fwd = next((e for e in log if e[0] == "forward"), None)
        bwd = next((e for e in log if e[0] == "backward"), None)
        state = lambda e: f"autocast({e[3]})" if e[2] else "no autocast"  # noqa: E731
        if fwd is not None and bwd is not None and (fwd[2] != bwd[2] or (fwd[2] and fwd[3] != bwd[3])):
            raise AssertionError(
                f"{case}: the forward ran fn under {state(fwd)}, the recomputation under {state(bwd)} (autocast "
                "state not restored in backward): record torch.is_autocast_enabled(d) / torch.get_autocast_dtype(d) "
                "in forward and rerun fn under torch.autocast(d, enabled=..., dtype=...), whatever backward runs under")
    check_like_direct(got, want, "checkpoint(fn, *args) under autocast", case, atol=1e-4, rtol=1e-4)




@pytest.mark.part("A")
@pytest.mark.points(2)
def test_checkpoint_does_not_use_torch_utils_checkpoint(impl, seed):
    names = imported_names(source(impl))
    bad = sorted(n for n in names if any(n == m or n.startswith(m + ".") for m in FORBIDDEN_MODULES))
    assert not bad, f"the submission imports {', '.join(bad)}: build the autograd.Function yourself (the contract " \
                    "forbids torch.utils.checkpoint)"
    got, want, _ = run_checkpoint(impl, seed, _args_two_grads, fn_spec())
    check_like_direct(got, want, "checkpoint(fn, x, w)", "two-inputs-require-grad")
    assert got["grad_fn"]["custom"] and not got["grad_fn"]["forward"].startswith("torch."), \
        f"the output's node is {got['grad_fn']['type']}: {REASON}"


# ----------------------------------------------------------------------------- Part B: checkpoint_sequential

def contract_split(n, s):
    return [i * n // s for i in range(s + 1)]


def torch_split(n, s):
    """torch.utils.checkpoint.checkpoint_sequential's split, which the contract refuses (see check_split)."""
    return [i * (n // s) for i in range(s)] + [n]


def checkpointed(split):
    """The blocks of each checkpointed segment (all but the last) of a split, empty ones left out."""
    return [list(range(split[i], split[i + 1])) for i in range(len(split) - 2) if split[i] < split[i + 1]]


SEQ_CASES = {"n8-s3": (8, 3), "n6-s2": (6, 2), "n4-s1": (4, 1), "n4-s4": (4, 4), "n5-s3": (5, 3)}


def run_sequential(impl, seed, n, segments, p=0.25):
    g = gen(seed, 2)
    x = torch.randn(5, 6, generator=g)
    go = torch.randn(5, 6, generator=g)
    rng_seed = int(torch.randint(0, 2**31, (1,), generator=g))
    specs, seeds = [block_spec(p)] * n, [seed + 17 * j for j in range(n)]
    common = dict(grad_output=go, requires_grad=(False, False, True), seed=rng_seed)
    mine = nets(impl, specs, seeds)
    got = recompute(impl.checkpoint_sequential, (mine, segments, x), watch=mine, forbid=FORBID, reason=REASON,
                    **common)
    ref = nets(None, specs, seeds)
    want = recompute(plain, (ref, segments, x), watch=ref, **common)
    return got, want, x, specs, seeds


def observed_split(got, n):
    """(blocks called per forward, blocks recomputed in backward (in block order), the checkpointed
    segments as seen from the recomputation: runs of consecutive calls)."""
    fwd = [sum(1 for e in log if e[0] == "forward") for log in got["logs"]]
    bwd = [[e[4] for e in log if e[0] == "backward"] for log in got["logs"]]
    recomputed = [j for j in range(n) if bwd[j]]
    segs: list = []
    for j in recomputed:
        if segs and segs[-1][-1] == j - 1 and len(bwd[j]) == 1 and len(bwd[j - 1]) == 1 and bwd[j][0] == bwd[j - 1][0] + 1:
            segs[-1].append(j)
        else:
            segs.append([j])
    return fwd, bwd, recomputed, segs


def check_split(got, n, s, case):
    """The segments seen from the recomputation are the contract's (the last one runs plainly)."""
    fwd, bwd, recomputed, segs = observed_split(got, n)
    again = [j for j in range(n) if fwd[j] != 1]
    assert not again, f"{case}: block {again[0]} was called {fwd[again[0]]} times during forward: forward calls " \
                      "each block once"
    twice = [j for j in range(n) if len(bwd[j]) > 1]
    assert not twice, f"{case}: block {twice[0]} was recomputed {len(bwd[twice[0]])} times in backward: once each"
    want, theirs = (checkpointed(split(n, s)) for split in (contract_split, torch_split))
    if segs == want:
        return
    last = contract_split(n, s)[-2]
    if recomputed and recomputed[-1] == n - 1:
        raise AssertionError(f"{case}: block {n - 1} (in the last segment, blocks {last}..{n - 1}) was "
                             "recomputed in backward: the last segment runs plainly (last segment checkpointed)")
    if not recomputed and s > 1:
        raise AssertionError(f"{case}: no block was recomputed in backward: the first {s - 1} segment(s) must go "
                             "through checkpoint (all activations saved anyway)")
    if segs == theirs:
        raise AssertionError(f"{case}: the checkpointed segments are {segs}, torch's split (n//segments blocks each, "
                             f"the remainder in the last); the contract's is {want} (segment i holds blocks "
                             "[i*n//segments, (i+1)*n//segments)): torch's last segment, run plainly, can hold almost "
                             "twice as many blocks and save twice as much (pytorch/pytorch#68423)")
    raise AssertionError(f"{case}: the checkpointed segments are {segs}; the contract's are {want} (segment i holds "
                         "blocks [i*n//segments, (i+1)*n//segments)): segments split wrongly")


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("n, segments", list(SEQ_CASES.values()), ids=list(SEQ_CASES))
def test_sequential_gradients_equal_a_plain_run(n, segments, impl, seed):
    got, want, *_ = run_sequential(impl, seed, n, segments)
    check_like_direct(got, want, f"checkpoint_sequential(blocks, {segments}, x)", f"n={n}, segments={segments}")


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("n, segments", [(8, 3), (5, 3), (4, 4), (6, 2)], ids=["n8-s3", "n5-s3", "n4-s4", "n6-s2"])
def test_sequential_recomputes_each_block_outside_the_last_segment_once(n, segments, impl, seed):
    got, want, *_ = run_sequential(impl, seed, n, segments)
    case = f"n={n}, segments={segments}"
    checked(got, lambda v: check_like_direct(v, want, "checkpoint_sequential", case), prop="the recomputation")
    check_split(got, n, segments, case)


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("n, segments", [(9, 3), (6, 2), (4, 1), (4, 4)], ids=["n9-s3", "n6-s2", "n4-s1", "n4-s4"])
def test_sequential_saved_bytes_within_the_bound(n, segments, impl, seed):
    """The bound of the contract's split: segments * x.nbytes + a plain run of its last segment. The cases split
    evenly (torch's split is the contract's there), so a wrong split is charged once, by the recomputation test."""
    got, want, x, specs, seeds = run_sequential(impl, seed, n, segments)
    case = f"n={n}, segments={segments}"
    checked(got, lambda v: check_like_direct(v, want, "checkpoint_sequential", case), prop="the saved-activation bound")
    start = contract_split(n, segments)[-2]
    last = nets(None, specs[start:], seeds[start:])
    tail = recompute(plain, (last, 1, x), watch=last, requires_grad=(False, False, True),
                     grad_output=torch.ones_like(x))
    tail_bytes = max(tail["packed_bytes"], tail["graph_saved_bytes"])  # the graph's count adds wrapped scalars
    bound = segments * x.numel() * x.element_size() + tail_bytes
    assert got["graph_saved_bytes"] <= bound, (
        f"{case}: when forward returns, the graph's nodes hold {got['graph_saved_bytes']} bytes for backward (read "
        f"from the nodes: {', '.join(got['graph_saved'][:3])}); the bound is {bound} bytes: all activations saved "
        "anyway? checkpointed segments keep only their input")
    assert got["packed_bytes"] <= bound, (
        f"{case}: autograd saved {got['packed_bytes']} bytes during forward (largest: {', '.join(got['packed'][:3])}); "
        f"the bound is segments * x.nbytes + a plain run of the last segment (blocks {start}..{n - 1}) = "
        f"{segments} * {x.numel() * x.element_size()} + {tail_bytes} = {bound} bytes: all activations saved "
        "anyway? checkpointed segments keep only their input")
    assert not got["kept"], f"{case}: a checkpoint node keeps {'; '.join(got['kept'])} in ctx (ctx keeping the " \
                            "output or intermediates): keep only the tensor arguments"


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_sequential_bad_segments_raise(impl, seed):
    """Each refusal after its valid neighbour (the same call with segments made valid), graded on its output and
    gradients: a function that only raises earns nothing here."""
    n = 3
    blocks = nets(impl, [block_spec()] * n, [seed + j for j in range(n)])
    x = torch.randn(2, 6, generator=gen(seed, 3))
    outside = f"segments outside [1, len(blocks)] = [1, {n}]"
    refused = {2: [(TypeError, bad, "segments is not an int") for bad in (2.0, "2", None)],
               1: [(ValueError, bad, outside) for bad in (0, -1)],
               n: [(ValueError, n + 1, outside)]}
    for ok, cases in refused.items():
        got, want, *_ = run_sequential(impl, seed, n, ok)
        check_like_direct(got, want, f"checkpoint_sequential(blocks, {ok}, x)",
                          f"n={n}, segments={ok} (the valid neighbour of segments={cases[0][1]!r})")
        for exc, bad, why in cases:
            expect_raises(exc, f"checkpoint_sequential of {n} blocks with segments={bad!r} ({why})",
                          impl.checkpoint_sequential, blocks, bad, x)


# ----------------------------------------------------------------------------- Part C: the loss scaler

OPT = {"name": "sgd", "lr": 0.1, "momentum": 0.9}


def scripted(seed, pattern, shapes=((3, 4), (4,))):
    """One step per letter: F finite gradients, I an inf, N a NaN, O finite but overflowing once
    scaled (3e38); lower case: the same with an explicit unscale_ before step."""
    g = gen(seed, 5)
    steps = []
    for ch in pattern:
        grads = [torch.randn(*s, generator=g) for s in shapes]
        k = ch.upper()
        if k == "I":
            grads[0].view(-1)[int(torch.randint(0, grads[0].numel(), (1,), generator=g))] = float("inf")
        elif k == "N":
            grads[1].view(-1)[int(torch.randint(0, grads[1].numel(), (1,), generator=g))] = float("nan")
        elif k == "O":
            grads[1].view(-1)[0] = 3e38
        steps.append({"grads": grads, "unscale": ch.islower()})
    params = [torch.randn(*s, generator=g) for s in shapes]
    return params, steps


SCRIPTS = {  # kwargs, pattern
    "grow-every-2": ({"init_scale": 2.0 ** 8, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2},
                     "FFfFFIFFFfF"),
    "backoff-runs": ({"init_scale": 2.0 ** 12, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 3},
                     "FFIiFFfFNFFFOF"),
    "grow-every-step": ({"init_scale": 2.0 ** 4, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1},
                        "FfIFoFFN"),
}


def scaler_runs(impl, seed, kwargs, pattern, twice_at=()):
    params, steps = scripted(seed, pattern)
    for i in twice_at:
        steps[i]["unscale"] = steps[i]["twice"] = True
    got = drive_scaler(impl.DynamicLossScaler, kwargs=kwargs, params=params, script=steps, optimizer=OPT)
    want = drive_scaler(GradScalerAdapter, kwargs={"device": "cpu", **kwargs}, params=params, script=steps,
                        optimizer=OPT)
    return got, want, steps


def check_trajectory(got, want, steps, name):
    assert got["init_scale"] == want["init_scale"], \
        f"{name}: scale_value before the first step is {got['init_scale']!r}, expected {want['init_scale']!r}"
    prev_scale = want["init_scale"]
    last_change = None  # how GradScaler's scale last changed before this step: "growth", "a backoff" or None
    for i, (g, w, st) in enumerate(zip(got["steps"], want["steps"], steps)):
        case = f"{name}, step {i} ({'overflow' if not w['stepped'] else 'finite'} gradients" \
               f"{', explicit unscale_' if st['unscale'] else ''})"
        if w["calls"] == 0 and g["calls"]:
            raise AssertionError(f"{case}: optimizer.step() ran although a gradient was inf/NaN (step taken on inf): "
                                 "skip it")
        if w["calls"] and not g["calls"]:
            raise AssertionError(f"{case}: optimizer.step() did not run although every gradient was finite")
        if g["stepped"] is not w["stepped"]:
            raise AssertionError(f"{case}: step() returned {g['stepped']!r}, expected {w['stepped']!r} (True iff the "
                                 "optimizer stepped)")
        if not isinstance(g["scale"], float):
            raise AssertionError(f"{case}: scale_value is {g['scale']!r}: a Python float")
        if not w["stepped"] and g["scale"] > prev_scale:
            raise AssertionError(f"{case}: the scale grew from {prev_scale} to {g['scale']} after an overflow (scale "
                                 f"grown after an overflow): it backs off to {w['scale']}")
        if not w["stepped"] and w["scale"] < 1.0 <= g["scale"] <= prev_scale:
            raise AssertionError(f"{case}: the scale backed off from {prev_scale:g} to {g['scale']:g}, GradScaler's to "
                                 f"{w['scale']:g} (backoff floored at a minimum scale, as min_scale=1 in some legacy "
                                 "scalers): the contract's scale has no floor; multiply it by backoff_factor whatever "
                                 "its value")
        if w["stepped"] and last_change and (g["scale"] != prev_scale) != (w["scale"] != prev_scale):
            grew = "grew" if g["scale"] != prev_scale else "did not grow"
            raise AssertionError(f"{case}: the scale {grew} ({prev_scale:g} -> {g['scale']:g}) where GradScaler's "
                                 f"is {w['scale']:g}: after {last_change} the count of clean steps restarts from 0 "
                                 f"(growth counter not reset after {last_change})")
        assert g["scale"] == w["scale"], f"{case}: scale_value after update() is {g['scale']}, torch.amp.GradScaler's " \
                                         f"is {w['scale']}"
        if st["unscale"] and w["grads"] is not None:
            for j, (gg, wg) in enumerate(zip(g["grads"], w["grads"])):
                assert_close(gg, wg, atol=1e-6, rtol=1e-6, what=f"gradient {j} after unscale_()", case=case,
                             equal_nan=True)
        for j, (gp, wp) in enumerate(zip(g["params"], w["params"])):
            try:
                assert_close(gp, wp, atol=1e-6, rtol=1e-6, what=f"parameter {j} after the step", case=case)
            except AssertionError as e:
                hint = (" (the gradients were right after unscale_(): step() unscaled them again; unscale applied "
                        "twice)") if st["unscale"] else ""
                raise AssertionError(f"{e}{hint}") from None
        for j, (gs, ws) in enumerate(zip(g["state"], w["state"])):
            for k, v in ws.items():
                assert k in gs, f"{case}: the optimizer state of parameter {j} lacks {k}"
                assert_close(gs[k], v, atol=1e-6, rtol=1e-6, what=f"optimizer state {k} of parameter {j}", case=case)
        if w["scale"] != prev_scale:
            last_change = "growth" if w["scale"] > prev_scale else "a backoff"
        prev_scale = w["scale"]


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_scaler_rejects_bad_arguments(impl, seed):
    """Per argument, its valid neighbour first (the same call with the argument made valid, graded on one clean step
    against GradScaler's), then its refusals: a constructor that only raises earns nothing here."""
    inf, nan = float("inf"), float("nan")
    refused = {("init_scale", 2.0 ** -3): [(0.0, "<= 0"), (-8.0, "<= 0"), (inf, "not finite"), (nan, "not finite")],
               ("growth_factor", 2.0): [(1.0, "<= 1"), (0.5, "<= 1")],
               ("backoff_factor", 0.25): [(0.0, "outside (0, 1)"), (1.0, "outside (0, 1)"), (1.5, "outside (0, 1)")],
               ("growth_interval", 1): [(0, "< 1")]}
    for (arg, ok), cases in refused.items():
        got, want, steps = scaler_runs(impl, seed, {arg: ok}, "F")
        check_trajectory(got, want, steps, f"DynamicLossScaler({arg}={ok!r}) (the valid neighbour of "
                                           f"{arg}={cases[0][0]!r})")
        for bad, why in cases:
            expect_raises(ValueError, f"DynamicLossScaler({arg}={bad!r}) ({arg} {why})", impl.DynamicLossScaler,
                          **{arg: bad})


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_scaler_scale_is_the_scaled_loss_and_differentiable(impl, seed):
    kwargs = {"init_scale": 2.0 ** 7}
    got, want, steps = scaler_runs(impl, seed, kwargs, "FF")
    for i, (g, w) in enumerate(zip(got["steps"], want["steps"])):
        assert g["scaled_requires_grad"], f"step {i}: scale(loss) does not require grad: return loss * scale_value " \
                                          "(differentiable), not a detached copy or a float"
        assert_close(g["scaled"], w["scaled"], atol=1e-5, rtol=1e-6, what="scale(loss)", case=f"step {i}, scale 2**7")
    assert isinstance(got["init_scale"], float), f"scale_value is {got['init_scale']!r}: a Python float"


@pytest.mark.part("C")
@pytest.mark.points(4)
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_scaler_trajectory_equals_grad_scaler(name, impl, seed):
    kwargs, pattern = SCRIPTS[name]
    got, want, steps = scaler_runs(impl, seed, kwargs, pattern)
    check_trajectory(got, want, steps, name)


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_scaler_backoff_has_no_floor(impl, seed):
    """Four overflows from a scale of 4 take it to 1/4 (GradScaler has no floor; legacy scalers such as
    mmdetection's and Megatron-LM's clamp at min_scale=1), then clean steps. Nothing is counted before a backoff and
    the scale grows once, so only the backoff rule matters."""
    kwargs = {"init_scale": 2.0 ** 2, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2}
    got, want, steps = scaler_runs(impl, seed, kwargs, "IiNIFfF")
    check_trajectory(got, want, steps, "from 4 down past 1")


@pytest.mark.part("C")
@pytest.mark.points(3)
def test_scaler_skipped_step_changes_neither_parameters_nor_optimizer_state(impl, seed):
    kwargs = {"init_scale": 2.0 ** 9, "growth_interval": 3}
    got, want, steps = scaler_runs(impl, seed, kwargs, "FFIfNiF")
    for i in range(1, len(steps)):
        if want["steps"][i]["stepped"]:
            continue
        g, before = got["steps"][i], got["steps"][i - 1]
        case = f"step {i} (inf/NaN gradients; momentum state from the steps before)"
        for j, (p, q) in enumerate(zip(g["params"], before["params"])):
            assert torch.equal(p, q), f"{case}: parameter {j} changed on a skipped step (step taken on inf?): it " \
                                      "must stay exactly as it was"
        for j, (s, t) in enumerate(zip(g["state"], before["state"])):
            for k in t:
                assert k in s and torch.equal(s[k], t[k]), f"{case}: optimizer state {k} of parameter {j} changed " \
                                                           "on a skipped step: do not call optimizer.step()"
    check_trajectory(got, want, steps, "FFIfNiF")


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_scaler_second_unscale_raises_runtime_error(impl, seed):
    got, want, steps = scaler_runs(impl, seed, {"init_scale": 2.0 ** 6}, "FFFF", twice_at=(1, 3))
    for i in (1, 3):
        # the valid neighbour: the first unscale_ of the iteration, graded on the gradients it leaves
        for j, (gg, wg) in enumerate(zip(got["steps"][i]["grads"], want["steps"][i]["grads"])):
            assert_close(gg, wg, atol=1e-6, rtol=1e-6, what=f"gradient {j} after the first unscale_()",
                         case=f"step {i}")
        assert got["steps"][i]["twice"] == "RuntimeError", (
            f"step {i}: a second unscale_(optimizer) before update() gave {got['steps'][i]['twice']}, expected "
            "RuntimeError (second unscale_ not refused: the gradients are already unscaled)")
    check_trajectory(got, want, steps, "FfFf with a second unscale_")


# ----------------------------------------------------------------------------- Part C: train_step

AMP = {"fp16": torch.float16, "bf16": torch.bfloat16}
TRAIN_SPEC = {"d_in": 6, "d_hidden": 16, "d_out": 4, "act": "gelu", "p": 0.0, "residual": False}
STALE = 1e4  # every .grad holds this before the first step (large: the scaler divides what a step keeps)


def reference_step(model, batch, loss_fn, optimizer, scaler, dtype=None):
    """The oracle: one float64 step (model in float64, no autocast, no scaling)."""
    x, t = batch
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x.double()), t.double() if t.is_floating_point() else t)
    loss.backward()
    optimizer.step()
    return loss.detach()


def train_batches(seed, loss, n=3, rows=8, overflow_at=()):
    g = gen(seed, 7)
    out = []
    for i in range(n):
        x = torch.randn(rows, TRAIN_SPEC["d_in"], generator=g)
        if loss == "cross_entropy":
            t = torch.randint(0, TRAIN_SPEC["d_out"], (rows,), generator=g)
        else:
            t = torch.randn(rows, TRAIN_SPEC["d_out"], generator=g) * (1e4 if i in overflow_at else 1.0)
        out.append((x, t))
    return out


def state_of(seed):
    g = gen(seed, 11)
    return {k: torch.randn(v.shape, generator=g) * 0.5 for k, v in RecomputeNet(TRAIN_SPEC).state_dict().items()}


def run_train(impl, seed, dtype, loss, batches, scaler="torch.amp.GradScaler", init_scale=2.0 ** 10, stale=STALE,
              **scaler_kwargs):
    opts = {"loss": f"torch.nn.functional.{loss}", "optimizer": OPT, "dtype": dtype,
            "scaler_kwargs": {"init_scale": init_scale, **scaler_kwargs}, "stale": stale}
    return train_steps(impl.train_step, spec=TRAIN_SPEC, state=state_of(seed), batches=batches, scaler=scaler,
                       opts=opts)


def reference(seed, loss, batches):
    opts = {"loss": f"torch.nn.functional.{loss}", "optimizer": OPT, "double": True, "stale": STALE}
    return train_steps(reference_step, spec=TRAIN_SPEC, state=state_of(seed), batches=batches, opts=opts)


def check_step(g, w, dtype, case, scale=None):
    """One step of the recipe: the model called once under autocast(dtype), float32 master weights, the scale after
    the step, the parameters against the float64 step (the returned loss is graded by its own test)."""
    calls = g["log"]
    assert len(calls) == 1, f"{case}: the model was called {len(calls)} times in one step: once"
    name = str(dtype).removeprefix("torch.")
    assert calls[0][2] and calls[0][3] == name, (
        f"{case}: the model's forward ran under autocast({calls[0][3]}) (autocast dtype ignored): run it under "
        f"torch.autocast(device_type='cpu', dtype=torch.{name}), the dtype argument" if calls[0][2] else
        f"{case}: the model's forward ran without autocast (forward not under autocast): run it under "
        f"torch.autocast(device_type='cpu', dtype=torch.{name})")
    bad = {n: d for n, d in g["dtypes"].items() if d != "float32"}
    assert not bad, f"{case}: parameters {bad}: they stay float32 (master weights); autocast casts for the ops"
    if scale is not None:
        assert g["scale"] == scale, f"{case}: the scale after the step is {g['scale']}, expected {scale}"
    check_params(g, w, dtype, case, hint=f" (each step starts from optimizer.zero_grad(set_to_none=True): every .grad "
                                         f"held {STALE:g} before the first step, and that must not add in; zero_grad "
                                         "missing?)")


def check_params(g, w, dtype, case, hint=""):
    patol, prtol = {torch.float16: (5e-3, 5e-3), torch.bfloat16: (2e-2, 2e-2)}[dtype]
    for n, wp in w["params"].items():
        try:
            assert_close(g["params"][n], wp, atol=patol, rtol=prtol, what=f"parameter {n} after the step", case=case)
        except AssertionError as e:
            raise AssertionError(f"{e}{hint}") from None


def check_loss(g, want, dtype, case, before, after):
    """The returned loss: detached, 0-dim float32, the loss of the step's own forward (``want``); ``before`` and
    ``after``: the scale before the step and after its update(), to name a loss that went through one of them."""
    loss = g["loss"]
    if type(loss) is not torch.Tensor or loss.dim() != 0 or loss.dtype != torch.float32:
        raise AssertionError(f"{case}: train_step returned {type(loss).__name__} "
                             f"{getattr(loss, 'dtype', '')} {tuple(getattr(loss, 'shape', ()))}: a 0-dim float32 tensor")
    assert not g["loss_requires_grad"], f"{case}: the returned loss requires grad: return loss.detach()"
    atol, rtol = tolerance(dtype, "cpu")
    got, w = float(loss), float(want)
    near = lambda factor: abs(got - w * factor) <= atol + rtol * abs(w * factor)  # noqa: E731
    if not near(1.0):
        if any(near(sc) for sc in (before, after) if sc != 1.0):
            raise AssertionError(f"{case}: train_step returned {got:.6g}, the scaled loss (loss returned scaled): "
                                 f"return the unscaled loss {w:.6g}")
        if after != before and near(before / after):
            raise AssertionError(
                f"{case}: train_step returned {got:.6g}, the loss times {before / after:g}: the scale went from "
                f"{before:g} to {after:g} in this step's update(), and the scaled loss was divided by the new scale "
                f"(loss unscaled with the scale after update()): return the forward's loss itself, {w:.6g}")
    assert_close(loss, want, atol=atol, rtol=rtol, what="the returned loss", case=case)


@pytest.mark.part("C")
@pytest.mark.points(4)
@pytest.mark.parametrize("amp", list(AMP))
@pytest.mark.parametrize("loss", ["cross_entropy", "mse_loss"])
def test_train_step_matches_a_float64_reference(amp, loss, impl, seed):
    dtype = AMP[amp]
    batches = train_batches(seed, loss)
    got = run_train(impl, seed, dtype, loss, batches)
    want = reference(seed, loss, batches)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        check_step(g, w, dtype, f"{amp}, {loss}, step {i}", scale=2.0 ** 10)


def check_overflow_run(got, seed, dtype, batches, init_scale):
    want = reference(seed, "mse_loss", [batches[0], batches[2]])
    check_step(got[0], want[0], dtype, "fp16, step 0", scale=init_scale)
    g1, g0 = got[1], got[0]
    case = "fp16, step 1 (targets ~1e4: the scaled float16 gradients overflow)"
    for n, p in g1["params"].items():
        assert torch.equal(p, g0["params"][n]), f"{case}: parameter {n} changed on an overflowing step: the step is " \
                                                "skipped (the scaler finds inf after the scaled backward)"
    for j, (s, t) in enumerate(zip(g1["state"], g0["state"])):
        for k in t:
            assert k in s and torch.equal(s[k], t[k]), f"{case}: optimizer state {k} of parameter {j} changed on " \
                                                       "a skipped step"
    assert g1["scale"] == init_scale / 2, f"{case}: the scale after the overflow is {g1['scale']}, expected it " \
                                          f"backed off to {init_scale / 2}"
    check_step(got[2], want[1], dtype, "fp16, step 2 (after the skipped step)", scale=init_scale / 2)


@pytest.mark.part("C")
@pytest.mark.points(3)
def test_train_step_overflow_leaves_parameters_and_state_and_backs_off(impl, seed):
    batches = train_batches(seed, "mse_loss", overflow_at=(1,))
    got = run_train(impl, seed, torch.float16, "mse_loss", batches)
    check_overflow_run(got, seed, torch.float16, batches, 2.0 ** 10)


@pytest.mark.part("C")
@pytest.mark.points(3)
def test_train_step_with_your_scaler(impl, seed):
    batches = train_batches(seed, "mse_loss", overflow_at=(1,))
    got = run_train(impl, seed, torch.float16, "mse_loss", batches, scaler=impl.DynamicLossScaler, init_scale=2.0 ** 8)
    check_overflow_run(got, seed, torch.float16, batches, 2.0 ** 8)


@pytest.mark.part("C")
@pytest.mark.points(3)
def test_train_step_returns_the_unscaled_loss_of_its_forward(impl, seed):
    """With torch's scaler, whose scale changes on every step here: it grows after each clean step (growth_interval
    1) and backs off on step 1 (float16, targets ~1e4: the scaled gradients overflow). Each step returns its own
    forward's loss, whatever the scale did in the step."""
    batches = train_batches(seed, "mse_loss", overflow_at=(1,))
    init = 2.0 ** 9
    got = run_train(impl, seed, torch.float16, "mse_loss", batches, init_scale=init, growth_interval=1)
    # the float64 oracle: step 1 from the parameters after step 0; step 1 is skipped, so step 2 from them too
    want = reference(seed, "mse_loss", batches[:2]) + reference(seed, "mse_loss", [batches[0], batches[2]])[1:]
    assert len(got) == len(want)
    before = init
    for i, (g, w) in enumerate(zip(got, want)):
        what = "an overflow: backs off" if i == 1 else "a clean step: grows"
        check_loss(g, w["loss"], torch.float16, f"fp16, mse_loss, step {i} ({what})", before, g["scale"])
        before = g["scale"]


@pytest.mark.part("C")
@pytest.mark.points(1)
def test_train_step_rejects_other_dtypes(impl, seed):
    """Its valid neighbours first (the same step with dtype float16 and bfloat16, from clean gradients, graded on the
    parameters against the float64 step), then the refusals: a train_step that only raises earns nothing here."""
    batches = train_batches(seed, "mse_loss", n=1)
    want = reference(seed, "mse_loss", batches)
    for ok in AMP.values():
        got = run_train(impl, seed, ok, "mse_loss", batches, stale=None)
        check_params(got[0], want[0], ok, f"train_step(..., dtype={ok}) (a valid neighbour of the refused dtypes)")
    for dtype in (torch.float32, torch.float64, torch.int8):
        expect_raises(TypeError, f"train_step(..., dtype={dtype}) (autocast dtypes are float16 and bfloat16)",
                      run_train, impl, seed, dtype, "mse_loss", batches)
