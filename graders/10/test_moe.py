"""Hidden graders of lab 10, Mixture of Experts (lab-contracts.md section 10).

Part A calls ``route``, ``load_balancing_loss`` and ``capacity`` on inputs drawn from the run
seed and compares them with float64 recomputations here (routing logits on a coarse grid to
force ties; continuous logits with a margin between neighbouring probabilities, so that float32
rounding cannot reorder them). Part B builds the implementation's ``MoE``, loads weights drawn
here into it (the contract's names: ``router.weight``, ``experts.{e}.w1/w2/w3.weight``) and
compares the output and every gradient with a dense float64 per-token reference
(:func:`reference`); its cost test counts the forward's FLOPs next to the code
(``FlopCounterMode``) on a routing designed so that every expert gets ``T*k/E`` tokens. Part C
runs ``ExpertParallelMoE`` on W gloo ranks: each rank builds the MoE with the same weights,
except that the experts of *other* ranks hold NaN (a rank may use only its own), shards it with
``from_moe`` and runs one forward and backward; the parent compares every rank with the
reference on the union of the ranks' tokens and reads the collectives from the c10d event log
(an all-to-all's ``sent``: the elements sent to other ranks, its own split left out).

One deviation, charged once: ``y`` with the gradients of a loss on ``y`` alone, and the aux loss
with the gradients of a loss on it alone, are graded by separate tests (in Parts B and C). The
layer's aux loss is graded as the contract's composition, ``load_balancing_loss`` of the routing:
where the submission's own ``load_balancing_loss`` deviates (Part A charges it), the layer's
aux loss may equal what that function gives (:func:`own_aux`). Part A's balanced and gradient
tests run at k = 1, where f_e's normalisation (the formula test's) cannot matter. A refusal
(ValueError) is credited only next to a right answer of the same call on a valid neighbour.
"""
from __future__ import annotations

import hashlib
import math
import re

import pytest
import torch
import torch.nn.functional as F

from harness.toolkit import (SandboxError, assert_close, check_one_counter, checked, expect_raises, measure,
                              param_grads, run_ranks, vjp)

ATOL = RTOL = 1e-5        # float32 on CPU
GATE_ATOL = 1e-6          # gates and the aux loss: a softmax and a division in float32
MARGIN = 1e-4             # continuous logits: neighbouring sorted probabilities differ by more than this
RANK_T = 60.0             # seconds per multi-rank run
WEIGHTS = ("w1", "w2", "w3")
A2A_OPS = ("alltoall_base_", "alltoall_", "all_to_all_single")
META = 4                  # metadata allowance: META * (W*E + T_r*(k+E)) elements per rank and direction


# ----------------------------------------------------------------------------- inputs

def gen(seed, *salt) -> torch.Generator:
    digest = hashlib.sha256(repr((seed,) + salt).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def make_state(g, d, dff, E) -> dict:
    """Router and SwiGLU expert weights, scaled like ``nn.Linear``'s init (logits ~ N(0, 1))."""
    st = {"router.weight": torch.randn(E, d, generator=g) / d ** 0.5}
    for e in range(E):
        st[f"experts.{e}.w1.weight"] = torch.randn(dff, d, generator=g) / d ** 0.5
        st[f"experts.{e}.w3.weight"] = torch.randn(dff, d, generator=g) / d ** 0.5
        st[f"experts.{e}.w2.weight"] = torch.randn(d, dff, generator=g) / dff ** 0.5
    return st


def sorted_gaps(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Per row, the smallest gap between neighbouring sorted probabilities among the first k+1."""
    s = probs.sort(dim=-1, descending=True).values[:, :k + 1]
    return (s[:, :-1] - s[:, 1:]).min(dim=-1).values if s.shape[1] > 1 else torch.full((probs.shape[0],), 1.0)


def draw_tokens(g, T, d, router, k, scale=1.0) -> torch.Tensor:
    """``x (T, d)`` whose float64 router probabilities have a margin (rows redrawn until they do)."""
    x = torch.randn(T, d, generator=g) * scale
    for _ in range(50):
        bad = sorted_gaps(torch.softmax(x.double() @ router.double().T, -1), k) <= MARGIN
        if not bad.any():
            return x
        x[bad] = torch.randn(int(bad.sum()), d, generator=g) * scale
    raise RuntimeError("could not draw tokens with a routing margin")  # a grader defect, not the student's


def designed_tokens(g, router, choice) -> torch.Tensor:
    """``x (T, d)`` routed to exactly ``choice (T, k)`` (descending): logits 4, 3, ... on the chosen
    experts and about -2 elsewhere, solved for x through the router (d >= E)."""
    T, k = choice.shape
    E = router.shape[0]
    logits = -2 + 0.1 * torch.randn(T, E, generator=g, dtype=torch.float64)
    logits.scatter_(1, choice, 4.0 - torch.arange(k, dtype=torch.float64).expand(T, k))
    R = router.double()
    x = (logits @ torch.linalg.solve(R @ R.T, R)).float()            # x @ R^T = logits
    got = torch.sort(torch.softmax(x.double() @ R.T, -1), dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(got, choice), "designed tokens do not route as designed"  # a grader defect
    return x


def balanced_choice(g, T, E, k) -> torch.Tensor:
    """``(T, k)`` experts, every expert chosen T*k/E times (E | T*k), in a seeded token order."""
    base = (torch.arange(T * k) % E).view(T, k)
    return base[torch.randperm(T, generator=g)]


# ----------------------------------------------------------------------------- the float64 reference

def expert64(w, x):
    return F.linear(F.silu(F.linear(x, w["w1"])) * F.linear(x, w["w3"]), w["w2"])


def keep_rule(hot, idx, gates, C, order="token"):
    """``(T, E)`` bool: assignments an expert keeps under capacity C, queued in ``order``: the
    contract's "token" order, or the bug classes "gate" (highest gate first) and "slot" (all
    first choices before any second choice)."""
    T, E = hot.shape
    if order == "token":
        return hot.bool() & ((hot.cumsum(0) - hot) < C)
    k = idx.shape[1]
    if order == "slot":
        key = torch.arange(k).view(1, k) * T + torch.arange(T).view(T, 1)   # slot-major
    else:
        key = torch.argsort(torch.argsort(-gates.reshape(-1), stable=True)).view(T, k)
    keep = torch.zeros(T, E, dtype=torch.bool)
    for e in range(E):
        t, j = (idx == e).nonzero(as_tuple=True)
        ranked = torch.argsort(key[t, j], stable=True)[:C]
        keep[t[ranked], e] = True
    return keep


def reference(state, xs, k, cf, E, gys=None, gaux=None, order="token", renorm_after_drops=False,
              per_rank_capacity=False, gated=True):
    """MoE on ``torch.cat(xs)`` in float64, one router copy per block of ``xs`` (so each block's
    share of the router gradient comes out): a dict with ``y`` (per block), ``aux``, ``idx``,
    ``gates``, ``keep`` and, given ``gys`` (per block) and ``gaux``, ``dx`` (per block),
    ``router`` (per-block shares), ``experts`` (per expert, {w: grad}). ``order``,
    ``renorm_after_drops``, ``per_rank_capacity`` and ``gated=False`` compute the bug classes
    the messages name."""
    grad = gys is not None
    routers = [state["router.weight"].double().requires_grad_(grad) for _ in xs]
    ex = [{w: state[f"experts.{e}.{w}.weight"].double().requires_grad_(grad) for w in WEIGHTS} for e in range(E)]
    xs64 = [x.double().requires_grad_(grad) for x in xs]
    logits = torch.cat([x @ R.T for x, R in zip(xs64, routers)])
    T = logits.shape[0]
    probs = torch.softmax(logits, -1)
    top, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, idx = top[:, :k], idx[:, :k]
    gates = top / top.sum(-1, keepdim=True)
    hot = torch.zeros(T, E, dtype=torch.float64).scatter(1, idx, 1.0)
    aux = E * ((hot.sum(0) / (T * k)) * probs.mean(0)).sum()
    keep = hot.bool()
    if cf is not None:
        if per_rank_capacity:
            sizes = [x.shape[0] for x in xs]
            parts = torch.split(hot, sizes)
            keep = torch.cat([keep_rule(h, None, None, math.ceil(cf * h.shape[0] * k / E)) for h in parts])
        else:
            keep = keep_rule(hot, idx, gates.detach(), math.ceil(cf * T * k / E), order)
    table = torch.zeros(T, E, dtype=torch.float64).scatter(1, idx, gates) * keep
    if renorm_after_drops:
        table = table / table.sum(-1, keepdim=True).clamp_min(1e-300)
    if not gated:
        table = keep.double()
    xcat = torch.cat(xs64)
    y = sum(table[:, e:e + 1] * expert64(ex[e], xcat) for e in range(E))
    out = {"y": [t.detach() for t in torch.split(y, [x.shape[0] for x in xs])], "aux": aux.detach(),
           "idx": idx, "gates": gates.detach(), "keep": keep}
    if grad:
        torch.autograd.backward([y, aux], [torch.cat(gys).double(), torch.as_tensor(gaux, dtype=torch.float64)])
        out["dx"] = [x.grad for x in xs64]
        out["router"] = [R.grad for R in routers]
        out["experts"] = [{w: e[w].grad for w in WEIGHTS} for e in ex]
    return out


def matches(got, want, atol=ATOL, rtol=RTOL) -> bool:
    return isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape) and \
        bool(torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol))


# ----------------------------------------------------------------------------- Part A: route

def route_oracle(logits: torch.Tensor, k: int):
    probs = torch.softmax(logits.double(), -1)
    top, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    return idx[:, :k], top[:, :k] / top[:, :k].sum(-1, keepdim=True), top[:, :k]


def check_route(out, logits, k, case):
    idx_want, gates_want, top = route_oracle(logits, k)
    T = logits.shape[0]
    if not (isinstance(out, tuple) and len(out) == 2):
        raise AssertionError(f"route must return (expert_idx, gates) ({case}), got {type(out).__name__}")
    idx, gates = out
    assert isinstance(idx, torch.Tensor) and idx.dtype == torch.int64 and tuple(idx.shape) == (T, k), (
        f"expert_idx must be int64 of shape (T, k) = {(T, k)} ({case}); got "
        f"{getattr(idx, 'dtype', type(idx).__name__)} {tuple(getattr(idx, 'shape', ()))}")
    assert isinstance(gates, torch.Tensor) and gates.dtype == torch.float32 and tuple(gates.shape) == (T, k), (
        f"gates must be float32 of shape (T, k) = {(T, k)} ({case}); got "
        f"{getattr(gates, 'dtype', type(gates).__name__)} {tuple(getattr(gates, 'shape', ()))}")
    if not torch.equal(idx, idx_want):
        bad = (idx != idx_want).any(-1).nonzero()[0, 0].item()
        row = logits[bad].double()
        same_set = torch.equal(idx.sort(-1).values, idx_want.sort(-1).values)
        if same_set:
            why = "the right experts in the wrong order (expert_idx must be in descending gate order, ties to the " \
                  "lower index)"
        else:
            why = "the wrong experts (the k largest probabilities; equal probabilities go to the lower expert " \
                  "index: torch.topk does not guarantee it, a stable descending sort does)"
        shown = [round(v, 4) for v in row.tolist()]
        raise AssertionError(f"route picked {why} ({case}): token {bad} with logits {shown} got experts "
                             f"{idx[bad].tolist()}, expected {idx_want[bad].tolist()}")
    if matches(gates, top, atol=GATE_ATOL, rtol=RTOL) and not matches(gates, gates_want, GATE_ATOL, RTOL):
        raise AssertionError(f"gates are the top-k probabilities, not renormalised to sum to 1 over the k chosen "
                             f"({case})")
    assert_close(gates, gates_want, atol=GATE_ATOL, rtol=RTOL, case=case,
                 what="gates (softmax(logits.float()) of the k chosen experts, renormalised to sum to 1)")


def continuous_logits(g, T, E, k, scale=2.0, dtype=torch.float32):
    """``(T, E)`` logits of ``dtype`` whose neighbouring sorted probabilities (as that dtype holds
    them) differ by more than MARGIN, rows redrawn until they do."""
    x = torch.randn(T, E, generator=g) * scale
    for _ in range(50):
        bad = sorted_gaps(torch.softmax(x.to(dtype).double(), -1), min(k, E - 1)) <= MARGIN
        if not bad.any():
            return x
        x[bad] = torch.randn(int(bad.sum()), E, generator=g) * scale
    raise RuntimeError("could not draw logits with a margin")  # a grader defect


ROUTE_CASES = [(1, 4, 1, "fp32"), (7, 4, 2, "fp32"), (33, 8, 2, "fp32"), (20, 6, 3, "fp32"), (9, 5, 5, "fp32"),
               (16, 8, 2, "fp64"), (16, 8, 2, "bf16"), (12, 6, 2, "transposed")]


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_route_matches_float64_reference(impl, seed):
    for T, E, k, kind in ROUTE_CASES:
        g = gen(seed, "route", T, E, k, kind)
        dtype = {"fp64": torch.float64, "bf16": torch.bfloat16}.get(kind, torch.float32)
        logits = continuous_logits(g, T, E, k, dtype=dtype).to(dtype)
        if kind == "transposed":
            logits = logits.t().contiguous().t()
        case = f"T={T}, E={E}, k={k}, {kind} logits"
        check_route(impl.route(logits, k), logits, k, case)


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_route_ties_go_to_the_lower_index(impl, seed):
    cases = [(8, 4, 1), (24, 8, 2), (16, 8, 3), (12, 6, 6)]
    for T, E, k in cases:
        g = gen(seed, "ties", T, E, k)
        logits = torch.round(torch.randn(T, E, generator=g) * 3) / 4     # a grid: many equal logits per row
        logits[0] = logits[0, 0].item()                                   # every expert tied
        logits[1] = torch.where(torch.arange(E) % 2 == 1, 1.0, 0.0)     # ties among the chosen and the rest
        check_route(impl.route(logits, k), logits, k, f"T={T}, E={E}, k={k}, logits on a grid of 1/4 (ties)")


@pytest.mark.part("A")
def test_route_gates_gradient_reaches_the_logits(impl, seed):
    T, E, k = 10, 6, 2
    g = gen(seed, "route-grad")
    logits, gg = continuous_logits(g, T, E, k), torch.randn(T, k, generator=g)
    l64 = logits.double().requires_grad_(True)
    probs = torch.softmax(l64, -1)
    top, _ = torch.sort(probs, dim=-1, descending=True, stable=True)
    (top[:, :k] / top[:, :k].sum(-1, keepdim=True)).backward(gg.double())
    res = vjp(impl.route, (logits, k), (torch.zeros(T, k), gg), requires_grad=(True, False))
    checked(res.out, lambda out: check_route(out, logits, k, f"T={T}, E={E}, k={k}"), prop="the gradient")
    assert res.grads[0] is not None, "no gradient reaches the logits through the gates (detached?)"
    assert_close(res.grads[0], l64.grad, atol=ATOL, rtol=RTOL, case=f"T={T}, E={E}, k={k}",
                 what="the gradient of the logits through the renormalised gates")


@pytest.mark.part("A")
def test_route_rejects_k_out_of_range(impl, seed):
    """k = 0 and k = E + 1 are refused; their neighbours k = 1 and k = E, on the same logits,
    are routed right (a refusal counts only next to the accepted call)."""
    logits = continuous_logits(gen(seed, "route-k"), 5, 4, 4)
    for bad, good in ((0, 1), (5, 4)):
        check_route(impl.route(logits, good), logits, good, f"T=5, E=4, k={good} (the valid neighbour of k={bad})")
        expect_raises(ValueError, f"route(logits (5, 4), k={bad}): k must be in [1, E=4]", impl.route, logits, bad)


# ----------------------------------------------------------------------------- Part A: load-balancing loss

def lb_oracle(probs, idx, E):
    f = torch.zeros(E, dtype=torch.float64).index_add(0, idx.reshape(-1), torch.ones(idx.numel(), dtype=torch.float64))
    f = f / idx.numel()
    return E * (f * probs.double().mean(0)).sum(), f


def aux_bug_classes(want, probs, idx, E) -> list:
    """(value, words) of the aux loss's bug classes, given the right value ``want``, the router
    probabilities ``probs (T, E)`` and the routed experts ``idx (T, k)``."""
    k = idx.shape[1]
    f = lb_oracle(probs, idx, E)[1]
    twice = E * (f * torch.softmax(probs.double(), -1).mean(0)).sum()
    out = [(want / E, f"the aux loss misses the factor E={E} (Switch: E * sum_e f_e P_e, 1.0 when balanced)"),
           (twice, "the aux loss is computed on softmax(softmax(logits)): the router probabilities went through a "
                   "second softmax (P_e is the mean of the probabilities themselves; a function that takes logits, "
                   "like Hugging Face's load_balancing_loss_func, must not be given probabilities)")]
    if k > 1:
        out.append((want * k, f"f_e must be the fraction of the T*k assignments sent to expert e (of T*k, not T: "
                              f"normalised by the T tokens, as Hugging Face's load_balancing_loss_func does, the loss "
                              f"is k={k} times the contract's, k at balance instead of 1.0)"))
    return out


def check_lb(got, probs, idx, E, case):
    want, f = lb_oracle(probs, idx, E)
    assert isinstance(got, torch.Tensor) and got.dim() == 0 and got.dtype == probs.dtype, (
        f"load_balancing_loss must return a 0-dim tensor of probs.dtype ({probs.dtype}) ({case}); got "
        f"{getattr(got, 'dtype', type(got).__name__)} of shape {tuple(getattr(got, 'shape', ()))}")
    tol = dict(atol=GATE_ATOL, rtol=RTOL)
    if not matches(got, want, **tol):
        for alt, words in aux_bug_classes(want, probs, idx, E):
            if matches(got, alt, **tol):
                raise AssertionError(f"{words} ({case}): got {got.item():.6g}, expected {want.item():.6g}")
    assert_close(got, want, **tol, case=case, what="load_balancing_loss = E * sum_e f_e * P_e")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_load_balancing_loss_matches_switch_formula(impl, seed):
    for T, E, k, dtype in [(13, 5, 2, torch.float32), (32, 8, 1, torch.float32), (9, 4, 3, torch.float64)]:
        g = gen(seed, "lb", T, E, k)
        probs = torch.softmax(torch.randn(T, E, generator=g, dtype=torch.float64) * 2, -1).to(dtype)
        idx = torch.argsort(torch.rand(T, E, generator=g), -1)[:, :k]     # k distinct experts per token
        check_lb(impl.load_balancing_loss(probs, idx, E), probs, idx, E, f"T={T}, E={E}, k={k}, {dtype}")


@pytest.mark.part("A")
def test_load_balancing_loss_is_one_when_balanced(impl, seed):
    """At k = 1, so that only "1.0 when balanced" is graded here: f_e's normalisation (the T*k
    assignments) is the formula test's."""
    g = gen(seed, "lb-one")
    T, E, k = 24, 6, 1
    idx = balanced_choice(g, T, E, k)                        # f_e = 1/E: the loss is sum_e P_e = 1
    probs = torch.softmax(torch.randn(T, E, generator=g), -1)
    uniform = torch.full((T, E), 1.0 / E)                     # P_e = 1/E: the loss is sum_e f_e = 1
    skewed = torch.argsort(torch.rand(T, E, generator=g), -1)[:, :k]
    for p, i, what in ((probs, idx, "balanced assignments, random probabilities"),
                       (uniform, skewed, "uniform probabilities, random assignments")):
        got = impl.load_balancing_loss(p, i, E)
        case = f"T={T}, E={E}, k={k}: {what}"
        check_lb(got, p, i, E, case)
        assert abs(got.item() - 1.0) <= 1e-5, f"the aux loss must be 1.0 when balanced ({case}), got {got.item()}"


@pytest.mark.part("A")
def test_load_balancing_loss_gradient_reaches_probs(impl, seed):
    """At k = 1, where f_e's normalisation (graded by the formula test) cannot matter."""
    g = gen(seed, "lb-grad")
    T, E, k = 11, 4, 1
    probs = torch.softmax(torch.randn(T, E, generator=g), -1)
    idx = torch.argsort(torch.rand(T, E, generator=g), -1)[:, :k]
    gout = torch.randn((), generator=g)
    res = vjp(impl.load_balancing_loss, (probs, idx, E), gout, requires_grad=(True, False, False))
    checked(res.out, lambda out: check_lb(out, probs, idx, E, f"T={T}, E={E}, k={k}"), prop="the gradient")
    _, f = lb_oracle(probs, idx, E)
    want = (gout.double() * E * f / T).expand(T, E)          # d/dprobs of E * sum_e f_e * mean_t probs_te
    assert res.grads[0] is not None, "no gradient reaches probs (the loss must be differentiable in P_e)"
    assert_close(res.grads[0], want, atol=GATE_ATOL, rtol=RTOL, case=f"T={T}, E={E}, k={k}",
                 what="the gradient of probs (E * f_e / T; f_e is a count, not differentiated)")


@pytest.mark.part("A")
def test_load_balancing_loss_rejects_wrong_num_experts(impl, seed):
    """num_experts=5 for probs (6, 4) is refused; the same call with num_experts=4 is right."""
    g = gen(seed, "lb-e")
    probs = torch.softmax(torch.randn(6, 4, generator=g), -1)
    idx = torch.argsort(torch.rand(6, 4, generator=g), -1)[:, :1]
    check_lb(impl.load_balancing_loss(probs, idx, 4), probs, idx, 4, "T=6, E=4, k=1 (the valid neighbour of "
             "num_experts=5)")
    expect_raises(ValueError, "load_balancing_loss(probs (6, 4), idx, num_experts=5)", impl.load_balancing_loss,
                  probs, idx, 5)


# ----------------------------------------------------------------------------- Part A: capacity

@pytest.mark.part("A")
@pytest.mark.points(2)
def test_capacity_is_ceil_of_the_float_expression(impl, seed):
    g = gen(seed, "capacity")
    # 1.1 * 25 * 2 / 5 is 11.000000000000002 in floats: capacity 12, not 11 (the contract's formula as written)
    cases = [(25, 5, 2, 1.1), (90, 2, 2, 1.1), (64, 8, 2, 1.25), (7, 3, 2, 1.0), (16, 4, 1, 0.5), (5, 8, 1, 1.0),
             (3, 7, 2, 0.1)]
    for _ in range(6):
        T, E = int(torch.randint(1, 200, (1,), generator=g)), int(torch.randint(1, 17, (1,), generator=g))
        k = int(torch.randint(1, E + 1, (1,), generator=g))
        cases.append((T, E, k, round(float(torch.rand((), generator=g)) * 2 + 0.05, 3)))
    for T, E, k, cf in cases:
        got, want = impl.capacity(T, E, k, cf), math.ceil(cf * T * k / E)
        assert isinstance(got, int) and got == want, (
            f"capacity(T={T}, E={E}, k={k}, capacity_factor={cf}) = {got!r}, expected math.ceil({cf} * {T} * {k} / {E})"
            f" = {want} (an int, evaluated in Python floats left to right)")
    for cf in (0.0, -1.0):
        expect_raises(ValueError, f"capacity(16, 4, 2, capacity_factor={cf}): it must be > 0", impl.capacity,
                      16, 4, 2, cf)


# ----------------------------------------------------------------------------- Part B: the layer
#
# y, the gradients of a loss on y alone (g_aux = 0) and the aux loss (its value, and the gradients
# of a loss on it alone) are graded by separate tests, so that one deviation costs its own
# points only: a wrong aux loss never fails a test of y, and a wrong y never fails the aux tests.

def build_moe(impl, state, d, dff, E, k, cf, dtype=None):
    m = impl.MoE(d, dff, E, k=k, capacity_factor=cf)
    if dtype is not None:
        m = m.to(dtype)
    m.load_state_dict({n: t.to(dtype) if dtype is not None else t for n, t in state.items()})
    return m


def split_out(out, case) -> tuple:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise AssertionError(f"MoE.forward must return (y, aux_loss) ({case}), got {type(out).__name__}")
    return out


def check_y(out, ref, case, variants=(), atol=ATOL, rtol=RTOL):
    """``out = (y, aux)``: ``y`` against the reference; ``variants``: (reference of a bug class, words)."""
    y, want = split_out(out, case)[0], ref["y"][0]
    if not matches(y, want, atol, rtol):
        # on some inputs two bug classes give the same output (a few drops that gate priority and slot
        # priority both pick): name every class the output fits, not the first one listed
        fits = [words for alt, words in variants if matches(y, alt["y"][0], atol, rtol)]
        if fits:
            raise AssertionError(f"{'; or: '.join(fits)} ({case}: the output fits {len(fits)} bug "
                                 f"class{'es' if len(fits) > 1 else ''} on these inputs)")
    assert_close(y, want, atol=atol, rtol=rtol, case=case, what="y (sum over the kept assignments of gate * expert(x))")


def own_aux(impl, state, xs, idx, E, gaux=None):
    """The aux loss as the submission's own ``load_balancing_loss`` computes it on the contract's
    routing of ``torch.cat(xs)`` (float32 probabilities, the reference's ``idx``): ``{"aux"}`` and,
    given ``gaux``, the gradients that function implies (its gradient of ``probs``, chained here
    in float64 through the softmax and the router): ``"router"`` and ``"dx"``, one per block of
    ``xs``. None when the function fails.

    The layer's aux loss is that function of the routing (the contract's composition). Where the
    function itself deviates (a wrong factor, a second softmax), Part A's tests charge it, and the
    layer's aux loss is graded against what the function gives: one deviation, charged once."""
    grad = gaux is not None
    routers = [state["router.weight"].double().requires_grad_(grad) for _ in xs]
    xs64 = [x.double().requires_grad_(grad) for x in xs]
    probs = torch.softmax(torch.cat([x @ R.T for x, R in zip(xs64, routers)]), -1)
    p32, gp = probs.detach().float(), None
    try:
        value = impl.load_balancing_loss(p32, idx, E)
        if grad:
            try:
                gp = vjp(impl.load_balancing_loss, (p32, idx, E), torch.as_tensor(float(gaux)),
                         requires_grad=(True, False, False)).grads[0]
            except AssertionError:  # its output carries no gradient: none reaches probs
                gp = None
    except SandboxError:  # the worker failed: not the submission's answer
        raise
    except Exception:  # noqa: BLE001 - a function that fails (or is missing) defers nothing
        return None
    if not (isinstance(value, torch.Tensor) and value.dim() == 0):
        return None
    out = {"aux": value.detach().double()}
    if grad:
        gp = gp if isinstance(gp, torch.Tensor) and gp.shape == probs.shape else torch.zeros_like(probs)
        probs.backward(gp.double())
        out["router"] = [R.grad for R in routers]
        out["dx"] = [x.grad for x in xs64]
    return out


def aux_variants(state, xs, ref, k, E) -> list:
    """(value, words) of the layer's aux-loss bug classes on ``torch.cat(xs)``: the loss's own
    (:func:`aux_bug_classes`) and counting the assignments kept after capacity drops."""
    probs = torch.softmax(torch.cat(xs).double() @ state["router.weight"].double().T, -1)
    T = probs.shape[0]
    after = E * ((ref["keep"].double().sum(0) / (T * k)) * probs.mean(0)).sum()
    out = aux_bug_classes(ref["aux"], probs, ref["idx"], E)
    if not torch.equal(ref["keep"], torch.zeros_like(ref["keep"]).scatter(1, ref["idx"], True)):
        out.append((after, "the aux loss counts the assignments after capacity drops: f_e is over the routed "
                           "assignments, before drops"))
    return out


def check_aux(aux, want, case, own=None, variants=()):
    """``aux`` against the aux loss ``want`` (a 0-dim float32 tensor), or else against ``own()``
    (:func:`own_aux`'s value: the submission's own load_balancing_loss of the same routing);
    ``variants``: (value of a bug class, words)."""
    assert isinstance(aux, torch.Tensor) and aux.dim() == 0 and aux.dtype == torch.float32, (
        f"aux_loss must be a 0-dim float32 tensor ({case}); got {getattr(aux, 'dtype', type(aux).__name__)} "
        f"{tuple(getattr(aux, 'shape', ()))}")
    if matches(aux, want, GATE_ATOL, RTOL):
        return
    mine = own() if own is not None else None
    if mine is not None and matches(aux, mine, GATE_ATOL, RTOL):
        return
    for alt, words in variants:
        if matches(aux, alt, GATE_ATOL, RTOL):
            raise AssertionError(f"{words} ({case}): got {aux.item():.6g}, expected {want.item():.6g}")
    assert_close(aux, want, atol=GATE_ATOL, rtol=RTOL, case=case,
                 what="aux_loss (load_balancing_loss of softmax(router(x).float()) over the routed assignments)")


def unweighted(state, xs, k, cf, E):
    return reference(state, xs, k, cf, E, gated=False), "y is the plain sum of the experts' outputs: combine " \
        "without the gate weight (y = sum_j gate_j * expert_j(x))"


LAYER_CASES = [(24, 4, 1), (32, 4, 2), (40, 8, 2), (20, 6, 3), (16, 4, 4)]


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("T, E, k", LAYER_CASES, ids=[f"T{t}-E{e}-k{k}" for t, e, k in LAYER_CASES])
def test_moe_matches_dense_reference(T, E, k, impl, seed):
    d, dff = 12, 20
    g = gen(seed, "layer", T, E, k)
    state = make_state(g, d, dff, E)
    x = draw_tokens(g, T, d, state["router.weight"], k)
    ref = reference(state, [x], k, None, E)
    out = build_moe(impl, state, d, dff, E, k, None)(x)
    check_y(out, ref, f"T={T}, d_model={d}, d_ff={dff}, E={E}, k={k}, no capacity",
            variants=[unweighted(state, [x], k, None, E)])


def check_grads(res, grads, ref, E, case):
    """The gradients of a loss on y alone: the router's (through the gates; first, as x's goes
    through it too), x's and every expert's."""
    want = ref["router"][0]
    got = grads.get("router.weight")
    got = torch.zeros_like(want) if got is None else got
    if not matches(got, want, 1e-4, 1e-4) and matches(got, torch.zeros_like(want), 1e-4, 1e-4):
        raise AssertionError(f"the gradient of y does not reach the router ({case}): the gates must stay in the "
                             "autograd graph (not detached, not replaced by counts)")
    assert_close(got, want, atol=1e-4, rtol=1e-4, case=case, what="the gradient of router.weight (through the gates)")
    assert_close(res.grads[0], ref["dx"][0], atol=1e-4, rtol=1e-4, case=case, what="the gradient of x")
    for e in range(E):
        for w in WEIGHTS:
            name = f"experts.{e}.{w}.weight"
            got, want = grads.get(name), ref["experts"][e][w]
            assert_close(torch.zeros_like(want) if got is None else got, want, atol=1e-4, rtol=1e-4, case=case,
                         what=f"the gradient of {name}")


def y_grad_case(impl, g, state, x, k, cf, E):
    """Forward and backward of the layer with a random gradient of y and none of the aux loss."""
    T, d = x.shape
    gy = torch.randn(T, d, generator=g)
    ref = reference(state, [x], k, cf, E, [gy], 0.0)
    m = build_moe(impl, state, d, state["experts.0.w1.weight"].shape[0], E, k, cf)
    res = vjp(m, (x,), (gy, torch.zeros(())), requires_grad=(True,))
    return m, res, ref


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("T, E, k", LAYER_CASES[:4], ids=[f"T{t}-E{e}-k{k}" for t, e, k in LAYER_CASES[:4]])
def test_moe_gradients_match_dense_reference(T, E, k, impl, seed):
    """x, router and expert gradients of a loss on y alone (g_aux = 0; the aux loss's gradient is
    graded by test_moe_aux_loss_gradient_reaches_the_router). At k = 1 every gate is 1: y gives
    the router no gradient."""
    d, dff = 12, 20
    g = gen(seed, "layer-grad", T, E, k)
    state = make_state(g, d, dff, E)
    x = draw_tokens(g, T, d, state["router.weight"], k)
    m, res, ref = y_grad_case(impl, g, state, x, k, None, E)
    case = f"T={T}, d_model={d}, E={E}, k={k}"
    checked(res.out, lambda out: check_y(out, ref, case), prop="the gradients")
    check_grads(res, param_grads(m), ref, E, case)


AUX_CASES = [(18, 4, 1, None), (26, 6, 2, None), (22, 5, 3, None), (30, 6, 2, 0.6)]


@pytest.mark.part("B")
@pytest.mark.points(3)
def test_moe_aux_loss_is_the_routed_load_balancing_loss(impl, seed):
    """aux_loss = load_balancing_loss(softmax(router(x).float()), expert_idx, E) over the routed
    assignments, before capacity drops (the last case drops some). Graded as that composition:
    where the submission's own load_balancing_loss deviates (Part A charges it), the layer's aux
    loss may equal what that function gives."""
    d, dff = 10, 12
    for T, E, k, cf in AUX_CASES:
        g = gen(seed, "aux", T, E, k, cf)
        state = make_state(g, d, dff, E)
        if cf is None:
            x = draw_tokens(g, T, d, state["router.weight"], k)
            ref = reference(state, [x], k, cf, E)
        else:
            x, ref = dropping_tokens(g, state, T, d, k, cf, E)
        case = f"T={T}, d_model={d}, E={E}, k={k}" + (f", capacity_factor={cf}, {T * k - int(ref['keep'].sum())} "
                                                      f"of {T * k} assignments dropped" if cf else "")
        aux = split_out(build_moe(impl, state, d, dff, E, k, cf)(x), case)[1]
        check_aux(aux, ref["aux"], case, own=lambda: (own_aux(impl, state, [x], ref["idx"], E) or {}).get("aux"),
                  variants=aux_variants(state, [x], ref, k, E))


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_moe_aux_loss_gradient_reaches_the_router(impl, seed):
    """The gradients of a loss on the aux loss alone (g_y = 0): the router's and x's, through
    softmax(router(x)) (f_e is a count, a constant). At k = 1 this is all the router learns."""
    d, dff = 10, 12
    for T, E, k in [(14, 4, 1), (21, 6, 2)]:
        g = gen(seed, "aux-grad", T, E, k)
        state = make_state(g, d, dff, E)
        x = draw_tokens(g, T, d, state["router.weight"], k)
        gaux = torch.randn((), generator=g)
        gy = torch.zeros(T, d)
        ref = reference(state, [x], k, None, E, [gy], gaux)
        m = build_moe(impl, state, d, dff, E, k, None)
        res = vjp(m, (x,), (gy, gaux), requires_grad=(True,))
        case = f"T={T}, d_model={d}, E={E}, k={k}, a loss on the aux loss alone"
        aux, want = split_out(res.out, case)[1], ref
        if isinstance(aux, torch.Tensor) and not matches(aux, ref["aux"], GATE_ATOL, RTOL):
            own = own_aux(impl, state, [x], ref["idx"], E, gaux)
            if own is not None and matches(aux, own["aux"], GATE_ATOL, RTOL):
                want = own            # the submission's load_balancing_loss deviates: Part A charges it
        checked(aux, lambda a: check_aux(a, want["aux"], case, variants=aux_variants(state, [x], ref, k, E)),
                prop="the aux loss's gradient")
        got = param_grads(m).get("router.weight")
        if got is None or (not got.abs().any() and want["router"][0].abs().max() > 1e-4):
            raise AssertionError(f"the aux loss's gradient does not reach the router ({case}): aux_loss must be "
                                 "computed from softmax(router(x)) in the autograd graph, not detached")
        assert_close(got, want["router"][0], atol=1e-4, rtol=1e-4, case=case,
                     what="the gradient of router.weight through the aux loss")
        assert_close(res.grads[0], want["dx"][0], atol=1e-4, rtol=1e-4, case=case,
                     what="the gradient of x through the aux loss (x -> router -> softmax -> P_e)")


CAP_CASES = [(32, 4, 1, 0.75), (32, 4, 2, 1.0), (36, 6, 2, 0.5), (30, 5, 3, 0.8)]
CAP_IDS = [f"T{t}-E{e}-k{k}-cf{cf}" for t, e, k, cf in CAP_CASES]


def dropping_tokens(g, state, T, d, k, cf, E):
    """Tokens (with a routing margin) of which capacity drops some, and their reference."""
    for _ in range(20):
        x = draw_tokens(g, T, d, state["router.weight"], k)
        ref = reference(state, [x], k, cf, E)
        if int(ref["keep"].sum()) < T * k:
            return x, ref
    raise RuntimeError("could not draw tokens of which capacity drops some")  # a grader defect


def capacity_variants(state, xs, k, cf, E, per_rank=False):
    """The bug classes a capacity result is compared with, most specific first."""
    out = [(reference(state, xs, k, cf, E, order="gate"), "capacity drops by gate (kept the highest gates): an "
            "expert keeps its first C assignments in token order (token 0 first)"),
           (reference(state, xs, k, cf, E, order="slot"), "capacity queues all first choices before the second "
            "choices: a token's slot j does not affect its place, assignments are kept in token order"),
           (reference(state, xs, k, cf, E, renorm_after_drops=True), "gates renormalised after drops: a dropped "
            "assignment contributes 0 and the token's other gates stay as they are"),
           (reference(state, xs, k, None, E), "nothing was dropped: with capacity_factor each expert keeps at most "
            "capacity(T, E, k, capacity_factor) assignments"),
           unweighted(state, xs, k, cf, E)]
    if per_rank:
        out.insert(0, (reference(state, xs, k, cf, E, per_rank_capacity=True), "capacity computed per rank: it is "
                       "capacity(sum_r T_r, E, k, cf), and drops follow the union's token order (earlier ranks' "
                       "tokens first)"))
    return out


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("T, E, k, cf", CAP_CASES, ids=CAP_IDS)
def test_capacity_drops_the_later_tokens(T, E, k, cf, impl, seed):
    d, dff = 10, 16
    g = gen(seed, "cap", T, E, k, cf)
    state = make_state(g, d, dff, E)
    x, ref = dropping_tokens(g, state, T, d, k, cf, E)
    C = math.ceil(cf * T * k / E)
    case = f"T={T}, d_model={d}, E={E}, k={k}, capacity_factor={cf} (capacity {C}), " \
           f"{T * k - int(ref['keep'].sum())} of {T * k} assignments dropped"
    out = build_moe(impl, state, d, dff, E, k, cf)(x)
    check_y(out, ref, case, variants=capacity_variants(state, [x], k, cf, E))


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("T, E, k, cf", CAP_CASES[1:3], ids=CAP_IDS[1:3])
def test_capacity_gradients_match_dense_reference(T, E, k, cf, impl, seed):
    """The gradients of a loss on y alone, with drops: a dropped assignment gives nothing back."""
    d, dff = 10, 16
    g = gen(seed, "cap-grad", T, E, k, cf)
    state = make_state(g, d, dff, E)
    x, _ = dropping_tokens(g, state, T, d, k, cf, E)
    m, res, ref = y_grad_case(impl, g, state, x, k, cf, E)
    case = f"T={T}, E={E}, k={k}, capacity_factor={cf}"
    checked(res.out, lambda out: check_y(out, ref, case, variants=capacity_variants(state, [x], k, cf, E)),
            prop="the gradients")
    check_grads(res, param_grads(m), ref, E, case)


@pytest.mark.part("B")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["fp64", "bf16"])
def test_moe_output_has_the_dtype_of_x(dtype, impl, seed):
    """A module and tokens in ``dtype``: y in ``dtype`` (its values checked), aux_loss float32 (its
    value is the aux tests'). The routing is designed with wide margins, so that bfloat16
    rounding cannot change it."""
    T, d, dff, E, k = 24, 12, 16, 4, 2
    g = gen(seed, "dtype", str(dtype))
    state = {n: t.to(dtype).to(torch.float32) for n, t in make_state(g, d, dff, E).items()}
    x = designed_tokens(g, state["router.weight"], balanced_choice(g, T, E, k)).to(dtype)
    ref = reference(state, [x.float()], k, None, E)
    out = build_moe(impl, state, d, dff, E, k, None, dtype=dtype)(x)
    case = f"{dtype}, T={T}, E={E}, k={k}"
    y, aux = split_out(out, case)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype, \
        f"y must have x's dtype {dtype} ({case}), got {getattr(y, 'dtype', type(y).__name__)}"
    tol = (ATOL, RTOL) if dtype == torch.float64 else (5e-2, 5e-2)
    check_y(out, ref, case, atol=tol[0], rtol=tol[1])
    assert isinstance(aux, torch.Tensor) and aux.dtype == torch.float32, (
        f"aux_loss must be float32 whatever x's dtype ({case}): load_balancing_loss of "
        f"softmax(router(x).float()); got {getattr(aux, 'dtype', type(aux).__name__)}")


@pytest.mark.part("B")
def test_moe_rejects_x_of_the_wrong_d_model(impl, seed):
    """x of d_model + 3 (and d_model - 2) columns is refused with a ValueError naming x or d_model
    and the width; the same layer on x of d_model columns is right."""
    T, d, dff, E, k = 9, 14, 10, 5, 2
    g = gen(seed, "d_model")
    state = make_state(g, d, dff, E)
    m = build_moe(impl, state, d, dff, E, k, None)
    x = draw_tokens(g, T, d, state["router.weight"], k)
    check_y(m(x), reference(state, [x], k, None, E), f"T={T}, d_model={d}, E={E}, k={k} (the valid neighbour of "
                                                     "the refused x)")
    for width in (d + 3, d - 2):
        bad = torch.randn(T, width, generator=g)
        e = expect_raises(ValueError, f"MoE(d_model={d}, ...)(x of shape ({T}, {width})): x must be (T, d_model)",
                          m, bad)
        msg = str(e)
        assert str(width) in msg and re.search(r"\bx\b|d_model", msg), (
            f"the ValueError for x of shape ({T}, {width}) at d_model={d} must name the argument (x or d_model) and "
            f"the value ({width}); got {msg[:200]!r}")


def flop_band(T, d, dff, E, k):
    low = 6 * d * dff * T * k                  # 3 matmuls of 2*d*d_ff FLOPs per (token, expert) assignment
    return low, 1.25 * low + 4 * T * d * E     # + the router's 2*T*d*E, and slack


@pytest.mark.part("B")
@pytest.mark.points(3)
def test_moe_flops_grow_with_k_not_E(impl, seed):
    """Forward arithmetic on a routing where every expert gets T*k/E tokens: the FLOPs
    (FlopCounterMode, matrix-vector products included) plus the element operations it leaves
    out (pointwise outputs, reduction inputs: a matmul written as broadcasting and ``sum`` costs
    there what it costs as FLOPs), in [6*d*d_ff*T*k, 1.25*6*d*d_ff*T*k + 4*T*d*E], whatever E."""
    T, d, dff = 40, 12, 24
    seen = []
    for E, k in [(4, 1), (8, 1), (4, 2), (8, 2), (8, 4)]:
        g = gen(seed, "flops", E, k)
        state = make_state(g, d, dff, E)
        x = designed_tokens(g, state["router.weight"], balanced_choice(g, T, E, k))
        ref = reference(state, [x], k, None, E)
        m = build_moe(impl, state, d, dff, E, k, None)
        out, meas = measure(m, x, alloc=False, ops=True, flops=True, no_grad=True)
        case = f"T={T}, d_model={d}, d_ff={dff}, E={E}, k={k}, every expert routed T*k/E={T * k // E} tokens"
        checked(out, lambda o: check_y(o, ref, case), prop="the FLOP count")
        low, high = flop_band(T, d, dff, E, k)
        cost = meas.flops + (meas.arith_elems or 0)
        seen.append(f"E={E}, k={k}: {meas.flops} + {meas.arith_elems}")
        assert cost >= low, (
            f"the forward counted {cost} FLOPs and element operations, below the {low} that k experts per token need "
            f"({case}): every expert must run its three matmuls (w1, w3, w2) in torch, under the FLOP counter")
        assert cost <= high, (
            f"the forward costs {meas.flops} FLOPs + {meas.arith_elems} element operations (pointwise outputs, "
            f"reduction inputs) = {cost}, {cost / low:.2f}x the 6*d*d_ff*T*k = {low} of running "
            f"each token through its k experts; the bound is {high:.0f} ({case}; so far: {'; '.join(seen)}): a dense "
            f"'run every expert on every token and mask' costs E/k = {E / k:g}x; run each expert once, on the tokens "
            "routed to it (gather, expert, weighted scatter-add)")


# ----------------------------------------------------------------------------- Part C: expert parallelism

def decoy_state(state, E, W, r):
    """Rank r's copy of the weights: its own experts' values, NaN for the other ranks' experts."""
    n = E // W
    out = dict(state)
    for e in range(E):
        if W > 1 and not r * n <= e < (r + 1) * n:
            for w in WEIGHTS:
                out[f"experts.{e}.{w}.weight"] = torch.full_like(state[f"experts.{e}.{w}.weight"], float("nan"))
    return out


def body_ep(rk, state, dims, xs, gys, gaux, members=None):
    """On this rank: build the MoE (other ranks' experts NaN), shard it with from_moe (in this
    rank's group of ``members``, if given), read what it holds, run forward and backward."""
    d, dff, E, k, cf = dims
    group, r, W = None, rk.rank, rk.world_size
    kwargs = {}
    if members is not None:
        mine = next(m for m in members if rk.rank in m)
        group = next(g for g in rk.new_groups(members) if g is not None)
        kwargs, r, W = {"group": group}, mine.index(rk.rank), len(mine)
    moe = rk.call(rk.impl.MoE, d, dff, E, k=k, capacity_factor=cf).out
    moe.load_state_dict(decoy_state(state, E, W, r))
    ep = rk.call(rk.impl.ExpertParallelMoE.from_moe, moe, **kwargs).out
    held, reach = rk.state(ep), rk.reachable_bytes(ep)
    rk.note("forward and backward")
    s = rk.backward(ep, ep, xs[rk.rank], grad_output=(gys[rk.rank], gaux), input_grads=True)
    return {"out": s.out, "dx": s.input_grads[0], "grads": s.grads, "events": s.events, "state": held,
            "reach": reach}


def ep_case(impl, seed, W, sizes, E, k, cf, d=8, dff=16, salt="ep", members=None, xs=None, state=None, on="y"):
    """Runs body_ep on W ranks (sizes: T_r per rank) and returns (results, state, xs, gys, gaux).
    ``on``: what the backward differentiates, a loss on "y" alone (g_aux = 0) or on "aux" alone
    (every g_y = 0), so that y's gradients and the aux loss's are graded apart."""
    g = gen(seed, salt, W, tuple(sizes), E, k, cf)
    state = state if state is not None else make_state(g, d, dff, E)
    xs = xs if xs is not None else [draw_tokens(g, T, d, state["router.weight"], k) for T in sizes]
    gys = [torch.randn(T, d, generator=g) * (on == "y") for T in sizes]
    gaux = torch.randn((), generator=g) * (on == "aux")
    world = W if members is None else sum(len(m) for m in members)
    res = run_ranks(body_ep, world, state, (d, dff, E, k, cf), xs, gys, gaux, members, impl=impl, timeout=RANK_T)
    return res, state, xs, gys, gaux


def check_ep_rank(out, ref, r, W, E, case, variants=()):
    """This rank's y against the reference's rows (the aux loss is graded apart: :func:`check_ep_aux`)."""
    y = out["out"][0] if isinstance(out["out"], tuple) and len(out["out"]) == 2 else out["out"]
    want = ref["y"][r]
    if isinstance(y, torch.Tensor) and y.shape == want.shape and torch.isnan(y).any():
        raise AssertionError(f"{case}: the output holds NaN: the rank used an expert it does not hold (the graders "
                             "give each rank's MoE NaN weights for the other ranks' experts): rank r computes only "
                             "its experts [r*E/W, (r+1)*E/W), on the tokens sent to it")
    if not matches(y, want):
        for alt, words in variants:
            if matches(y, alt["y"][r]):
                raise AssertionError(f"{words} ({case})")
    assert_close(y, want, atol=ATOL, rtol=RTOL, case=case,
                 what="y_r (MoE's output on the union of the ranks' tokens, this rank's rows)")


def check_ep_aux(res, ref, case_of, own, variants=()):
    """Every rank's aux loss is the union's (``ref["aux"]``), or else every rank's equals the
    submission's own load_balancing_loss of the union's routing (``own()``: :func:`own_aux`'s
    dict, or None). Returns the one the ranks matched, to grade the gradients against."""
    auxes = [out["out"][1] if isinstance(out["out"], tuple) and len(out["out"]) == 2 else out["out"] for out in res]
    agree = lambda want: all(isinstance(a, torch.Tensor) and matches(a, want, GATE_ATOL, RTOL) for a in auxes)
    if agree(ref["aux"]):
        return ref
    mine = own()
    if mine is not None and agree(mine["aux"]):
        return mine           # the submission's load_balancing_loss deviates: Part A charges it
    for r, aux in enumerate(auxes):
        check_aux(aux, ref["aux"], case_of(r), variants=variants)
    return ref


def check_router_share(got, share, full, W, case, what):
    got = torch.zeros_like(share) if got is None else got
    if W > 1 and not matches(got, share, 1e-4, 1e-4) and matches(got, full, 1e-4, 1e-4):
        raise AssertionError(f"{case}: router.weight's gradient is the sum over the ranks: each rank keeps its "
                             "share (its tokens' part; summed over the ranks it is MoE's), no all-reduce")
    assert_close(got, share, atol=1e-4, rtol=1e-4, case=case, what=what)


def check_ep_grads(out, ref, r, W, E, case):
    """The gradients of a loss on y alone: this rank's router share, its experts', x_r's."""
    n = E // W
    check_router_share(out["grads"].get("router.weight"), ref["router"][r], sum(ref["router"]), W, case,
                       "the gradient of router.weight (this rank's share: through its own tokens' gates)")
    for j in range(n):
        for w in WEIGHTS:
            name = f"experts.{j}.{w}.weight"
            g, want = out["grads"].get(name), ref["experts"][r * n + j][w]
            assert_close(torch.zeros_like(want) if g is None else g, want, atol=1e-4, rtol=1e-4, case=case,
                         what=f"the gradient of {name} (global expert {r * n + j}, from every rank's tokens)")
    assert_close(out["dx"], ref["dx"][r], atol=1e-4, rtol=1e-4, case=case,
                 what="the gradient of x_r (the off-rank experts' part comes back through the reverse all-to-all)")


EP_SIZES = {1: [13], 2: [9, 4], 4: [5, 1, 8, 3]}


@pytest.mark.part("C")
@pytest.mark.points(3)
@pytest.mark.parametrize("W", [1, 2, 4], ids=lambda w: f"W{w}")
def test_expert_parallel_equals_single_process(W, impl, seed):
    E, k = 8, 2
    res, state, xs, gys, gaux = ep_case(impl, seed, W, EP_SIZES[W], E, k, None)
    ref = reference(state, xs, k, None, E, gys, gaux)
    for r, out in enumerate(res):
        case = f"W={W}, rank {r}, T_r={EP_SIZES[W]}, E={E}, k={k}, no capacity"
        check_ep_rank(out, ref, r, W, E, case, variants=[unweighted(state, xs, k, None, E)])
        check_ep_grads(out, ref, r, W, E, case)


@pytest.mark.part("C")
@pytest.mark.parametrize("W", [2, 4], ids=lambda w: f"W{w}")
def test_expert_parallel_aux_loss_is_the_unions(W, impl, seed):
    """Every rank returns the union's aux loss; a loss on it alone (every g_y = 0, the same g_aux
    on every rank) gives each rank's router its share (through its own tokens: the other ranks'
    statistics are constants; summed over the ranks it is MoE's) and x_r its part."""
    E, k = 8, 2
    sizes = {2: [10, 7], 4: [4, 9, 2, 6]}[W]
    res, state, xs, gys, gaux = ep_case(impl, seed, W, sizes, E, k, None, salt="ep-aux", on="aux")
    ref = reference(state, xs, k, None, E, gys, gaux)
    case_of = lambda r: f"W={W}, rank {r}, T_r={sizes}, E={E}, k={k}, a loss on the aux loss alone"
    want = check_ep_aux(res, ref, case_of, lambda: own_aux(impl, state, xs, ref["idx"], E, gaux),
                        variants=aux_variants(state, xs, ref, k, E))
    for r, out in enumerate(res):
        got, share = out["grads"].get("router.weight"), want["router"][r]
        if got is not None and not matches(got, share, 1e-4, 1e-4) and matches(got, W * share, 1e-4, 1e-4):
            raise AssertionError(f"{case_of(r)}: router.weight's gradient counts the aux loss W={W} times: its "
                                 "backward must not sum over the ranks (the union's statistics are constants there)")
        check_router_share(got, share, sum(want["router"]), W, case_of(r),
                           "the gradient of router.weight through the aux loss (this rank's share)")
        assert_close(out["dx"], want["dx"][r], atol=1e-4, rtol=1e-4, case=case_of(r),
                     what="the gradient of x_r through the aux loss")


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [2, 4], ids=lambda w: f"W{w}")
def test_expert_parallel_capacity_follows_the_union(W, impl, seed):
    E, k, cf = 4, 2, 0.75
    sizes = {2: [12, 7], 4: [6, 9, 2, 7]}[W]
    res, state, xs, gys, gaux = ep_case(impl, seed, W, sizes, E, k, cf, salt="ep-cap")
    ref = reference(state, xs, k, cf, E, gys, gaux)
    C = math.ceil(cf * sum(sizes) * k / E)
    for r, out in enumerate(res):
        case = f"W={W}, rank {r}, T_r={sizes}, E={E}, k={k}, capacity_factor={cf} (capacity {C} over the union)"
        check_ep_rank(out, ref, r, W, E, case, variants=capacity_variants(state, xs, k, cf, E, per_rank=True))
        check_ep_grads(out, ref, r, W, E, case)


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [2, 4], ids=lambda w: f"W{w}")
def test_rank_holds_the_router_and_only_its_experts(W, impl, seed):
    E, k, d, dff = 8, 2, 8, 16
    res, state, xs, gys, gaux = ep_case(impl, seed, W, [6] * W, E, k, None, salt="ep-hold")
    ref = reference(state, xs, k, None, E, gys, gaux)
    n = E // W
    for r, out in enumerate(res):
        case = f"W={W}, rank {r}, E={E}"
        checked(out, lambda o: (check_ep_rank(o, ref, r, W, E, case), check_ep_grads(o, ref, r, W, E, case)),
                prop="what the rank holds")
        want = {"router.weight": state["router.weight"]}
        want.update({f"experts.{j}.{w}.weight": state[f"experts.{r * n + j}.{w}.weight"]
                     for j in range(n) for w in WEIGHTS})
        held = out["state"]
        assert isinstance(held, dict) and set(held) == set(want), (
            f"{case}: the module's state_dict holds {sorted(held) if isinstance(held, dict) else held}, expected "
            f"exactly the router and this rank's E/W={n} experts: {sorted(want)}")
        for name, t in want.items():
            if not torch.equal(held[name].float(), t):
                j = next((e for e in range(E) for w in WEIGHTS if name.endswith(f".{w}.weight")
                          and torch.equal(held[name].float(), state[f"experts.{e}.{w}.weight"])), None)
                hint = f" (it holds global expert {j}'s)" if j is not None else ""
                raise AssertionError(f"{case}: {name} is not global expert {r * n + int(name.split('.')[1])}'s "
                                     f"weight{hint}: rank r holds experts [r*E/W, (r+1)*E/W) in order"
                                     if name != "router.weight" else f"{case}: router.weight is not the MoE's")
        own = 4 * (E * d + n * 3 * d * dff)
        assert out["reach"]["total"] <= own + 4096, (
            f"{case}: {out['reach']['total']} bytes of tensor storage are reachable from the module, its own "
            f"parameters are {own} (largest: {out['reach']['largest']}): a rank holds the router and its experts "
            "only (no reference to the whole MoE or the other experts)")


def comm_of(events, W):
    """(forward, backward) element counts of the collectives a rank issued, and a listing: an
    all-to-all counts what it sent to the other ranks (its own split left out), any other
    collective its whole tensor (none at W = 1)."""
    cut = next((i for i, e in enumerate(events) if e["k"] == "forward_done"), len(events))
    sides = []
    for part in (events[:cut], events[cut:]):
        total, listing = 0, []
        for e in part:
            if e["k"] != "c10d":
                continue
            if e.get("op") in A2A_OPS:
                n = e.get("sent", e.get("numel", 0))
            else:
                n = e.get("numel", 0) if W > 1 else 0
            total += n
            listing.append(f"{e.get('op')}({n})")
        sides.append((total, ", ".join(listing) or "none"))
    return sides


def local_choice(g, W, E, k, T_r, m_off):
    """Per rank, (T_r, k) experts: m_off tokens routed to k experts of the next rank, the others
    to k of its own (k <= E/W), in a seeded token order."""
    n = E // W
    out = []
    for r in range(W):
        rows = []
        for t in range(T_r):
            s = (r + 1) % W if t < m_off else r
            rows.append((s * n + torch.randperm(n, generator=g)[:k]).tolist())
        out.append(torch.tensor(rows)[torch.randperm(T_r, generator=g)])
    return out


@pytest.mark.part("C")
@pytest.mark.points(3)
@pytest.mark.parametrize("W", [1, 2, 4], ids=lambda w: f"W{w}")
def test_only_off_rank_assignments_travel(W, impl, seed):
    """Routing designed with locality: per rank, m_off tokens go to the next rank's experts, the
    rest stay; rank r may send (A_off + A_in) * d_model elements of token rows (its tokens' off-rank
    assignments out, the other ranks' assignments to its experts back) plus metadata, forward and
    backward alike; at W = 1 nothing."""
    E, k, d, dff, T_r, m_off = 8, 2, 64, 8, 16, 2
    g = gen(seed, "ep-comm", W)
    state = make_state(g, d, dff, E)
    choices = local_choice(g, W, E, k, T_r, m_off if W > 1 else 0)
    xs = [designed_tokens(g, state["router.weight"], c) for c in choices]
    res, _, _, gys, gaux = ep_case(impl, seed, W, [T_r] * W, E, k, None, d=d, dff=dff, salt="ep-comm", xs=xs,
                                   state=state)
    ref = reference(state, xs, k, None, E, gys, gaux)
    n = E // W
    for r, out in enumerate(res):
        case = f"W={W}, rank {r}, T_r={T_r}, d_model={d}, E={E}, k={k}"
        checked(out, lambda o: (check_ep_rank(o, ref, r, W, E, case), check_ep_grads(o, ref, r, W, E, case)),
                prop="the communication")
        a_off = int((choices[r] // n != r).sum())
        a_in = sum(int((choices[s] // n == r).sum()) for s in range(W) if s != r)
        rows = (a_off + a_in) * d
        meta = META * (W * E + T_r * (k + E))
        check_one_counter(out["events"], case)
        for side, (sent, listing) in zip(("forward", "backward"), comm_of(out["events"], W)):
            if W == 1:
                assert sent == 0, f"{case}: at W=1 nothing may be sent; the {side} sent {sent} elements ({listing})"
                continue
            every = (W - 1) * T_r * d
            hint = (f"; sending every token to every rank costs (W-1)*T_r*d_model = {every} each way: send a token "
                    "only to the ranks that hold one of its experts" if sent >= every else "")
            assert sent <= rows + meta, (
                f"{case}: the {side} sent {sent} elements ({listing}); the bound is (A_off + A_in) * d_model = "
                f"({a_off} + {a_in}) * {d} = {rows} elements of token rows plus {meta} of metadata "
                f"({META} * (W*E + T_r*(k+E))){hint}; only the assignments to other ranks' experts travel (a "
                "token at most once per rank), with small metadata (counts)")


def body_errors(rk, state, dims, xs, E_bad):
    """On this rank: the valid neighbour first (from_moe of a MoE with E experts, E % W == 0, and
    one forward), then from_moe of a MoE with E_bad experts."""
    d, dff, E, k = dims
    moe = rk.call(rk.impl.MoE, d, dff, E, k=k).out
    moe.load_state_dict(state)
    ep = rk.call(rk.impl.ExpertParallelMoE.from_moe, moe).out
    out = rk.call(ep, xs[rk.rank]).out
    bad = rk.call(rk.impl.MoE, d, dff, E_bad, k=k).out
    try:
        rk.call(rk.impl.ExpertParallelMoE.from_moe, bad)
        return out, "no error", ""
    except Exception as e:  # noqa: BLE001 - the type and message are graded
        return out, type(e).__name__, str(e)


@pytest.mark.part("C")
def test_experts_not_divisible_by_W_raise_value_error(impl, seed):
    """At W=3, from_moe of a MoE with E=4 experts is refused; its neighbour E=6 shards and runs right."""
    d, dff, E, k, sizes = 8, 8, 6, 2, [4, 3, 5]
    g = gen(seed, "ep-errors")
    state = make_state(g, d, dff, E)
    xs = [draw_tokens(g, T, d, state["router.weight"], k) for T in sizes]
    ref = reference(state, xs, k, None, E)
    for r, (out, kind, msg) in enumerate(run_ranks(body_errors, 3, state, (d, dff, E, k), xs, 4, impl=impl,
                                                   timeout=RANK_T)):
        check_ep_rank({"out": out}, ref, r, 3, E, f"W=3, rank {r}, T_r={sizes}, E={E}, k={k} (the valid "
                                                  "neighbour of E=4)")
        assert kind == "ValueError", f"from_moe of a MoE with E=4 experts at W=3 (rank {r}): {kind} {msg[:200]}, " \
                                     "expected ValueError (E % W != 0)"


@pytest.mark.part("C")
def test_group_is_honoured(impl, seed):
    """W=4 split into groups {0, 1} and {2, 3}: each group runs its own expert-parallel MoE on its
    two ranks' tokens."""
    E, k, members = 4, 2, [[0, 1], [2, 3]]
    sizes = [7, 5, 6, 4]
    try:
        res, state, xs, gys, gaux = ep_case(impl, seed, 4, sizes, E, k, None, salt="ep-group", members=members)
        for m in members:
            mx = [xs[i] for i in m]
            ref = reference(state, mx, k, None, E, [gys[i] for i in m], gaux)
            case_of = lambda r: f"group {m}, rank {r} (world rank {m[r]}), E={E}, k={k}"
            for r, world in enumerate(m):
                check_ep_rank(res[world], ref, r, 2, E, case_of(r))
                check_ep_grads(res[world], ref, r, 2, E, case_of(r))
            check_ep_aux([res[w] for w in m], ref, case_of,
                         lambda: own_aux(impl, state, mx, ref["idx"], E), variants=aux_variants(state, mx, ref, k, E))
    except AssertionError as e:
        raise AssertionError(f"{e}\n(in groups [[0, 1], [2, 3]] of a world of 4: W and r are "
                             "dist.get_world_size(group) and dist.get_rank(group); every collective is issued on "
                             "group)") from None
