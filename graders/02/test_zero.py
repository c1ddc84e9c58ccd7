"""Hidden graders of lab 02, ZeRO-1 sharded AdamW (lab-contracts.md section 02).

Each case runs ZeroAdamW on W spawned gloo ranks (run_ranks) for
a few steps, every rank feeding its own gradients; the parent replays the same
steps with single-process torch.optim.AdamW fed the averaged gradients (and
torch.nn.utils.clip_grad_norm_ when clipping) and compares the parameters after
every step (float32: atol 1e-6, rtol 1e-5), on every rank.

A part's tests pass or fail on that part alone: only Part B's tests set
max_grad_norm or read grad_norm, and only the per-group test gives a param group
options of its own. Gradients are multiples of 2**-8, so their average is exact in
any summation order. Adam is nearly scale invariant at the default eps: a missing
/ W shows where eps is large (test_gradients_are_averaged_not_summed) and in
grad_norm. A failure is replayed with the bug classes in SUSPECTS: the test that
grades that bug names it; any other test passes a result that is exactly that
bug's replay, so a deviation costs the points of its own test, once.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch

from harness.toolkit import MiB, RankError, RankTimeout, assert_close, run_ranks

T = 60.0
ATOL, RTOL = 1e-6, 1e-5


# ----------------------------------------------------------------------------- scenario

def make_params(seed, groups):
    """Initial parameters: ``groups`` is a list of (shapes, options) per param group."""
    g = torch.Generator().manual_seed(seed % 2**63)
    return [[torch.randn(s, generator=g) for s in shapes] for shapes, _ in groups]


def make_grad(seed, rank, step, gi, pi, shape):
    """One rank's gradient, in multiples of 2**-8: a sum over <= 4 ranks is exact, in any order."""
    g = torch.Generator().manual_seed((seed * 7919 + rank * 1009 + step * 101 + gi * 13 + pi) % 2**63)
    return torch.round(torch.randn(shape, generator=g) * 256) / 256 * (1 + gi)


def has_grad(none, rank, step, gi, pi) -> bool:
    """``none`` maps (gi, pi) to "all" (grad None on every rank, every step), ("steps", [s...])
    (None on every rank in those steps, 0-based) or ("ranks", [r...]) (None on those ranks)."""
    rule = none.get((gi, pi))
    if rule is None:
        return True
    if rule == "all":
        return False
    kind, arg = rule
    return (step if kind == "steps" else rank) not in arg


def body_train(rk, seed, groups, steps, kwargs, none, world_group=None, memory=False, norm=False):
    """Runs here, driving one rank: the parameters live on the rank (``rk.keep``), the grader
    sets each step's gradients there and reads the parameters back after ``step()`` (and
    ``grad_norm`` if ``norm``: only Part B's tests read it)."""
    group = None
    rank, W = rk.rank, rk.world_size
    if world_group is not None:  # split the world into subgroups, run in ours
        subgroups = rk.new_groups(world_group)
        group = next(g for g, m in zip(subgroups, world_group) if rank in m)
        members = next(m for m in world_group if rank in m)
        rank, W = members.index(rank), len(members)
    params = [[rk.keep(p.clone().requires_grad_(True)) for p in ps] for ps in make_params(seed, groups)]
    shapes = [list(s) for s, _ in groups]
    pg = [{"params": ps, **opts} for ps, (_, opts) in zip(params, groups)]

    def set_grads(step):
        for gi, ps in enumerate(params):
            for pi, p in enumerate(ps):
                p.grad = (make_grad(seed, rank if world_group is None else rk.rank, step, gi, pi, shapes[gi][pi])
                          if has_grad(none, rank, step, gi, pi) else None)
    set_grads(0)
    before = rk.resident_bytes(rk.impl) if memory else None  # params and one step's grads: not state
    opt = rk.impl.ZeroAdamW(pg, group=group, **kwargs)
    out = []
    for step in range(steps):
        if step:
            set_grads(step)
        c = rk.call(opt.step)
        gn = opt.grad_norm if norm else None
        last = not memory or step == steps - 1  # a memory case reads its (large) parameters back once
        out.append({"params": torch.cat([p.detach().reshape(-1) for ps in params for p in ps]) if last else None,
                    "grad_norm": gn.detach().clone() if isinstance(gn, torch.Tensor) else gn,
                    "comm": c.comm})
    result = {"steps": out}
    if memory:  # the outside figure (None where /proc is unreadable) and the optimizer walk (a diagnostic)
        after = rk.resident_bytes(rk.impl)
        result["growth"] = None if before is None or after is None else after - before
        result["state_bytes"] = rk.reachable_bytes(opt, exclude=[p for ps in params for p in ps])
    return result


class EpsInsideAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update with eps inside the square root, p -= lr * m_hat /
    sqrt(v_hat + eps): the eps-placement suspect's replay (float32, as the lab computes)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            lr, (b1, b2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
            for p in (p for p in g["params"] if p.grad is not None):
                st = self.state[p]
                if not st:
                    st.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                st["step"] += 1
                t = st["step"]
                p.mul_(1 - lr * wd)
                st["m"].lerp_(p.grad, 1 - b1)
                st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.addcdiv_(st["m"], (st["v"] / (1 - b2 ** t)).add_(eps).sqrt_(), value=-lr / (1 - b1 ** t))


def reference(seed, groups, steps, kwargs, none, W, rank_of=lambda r: r, summed=False, count="param",
              eps_inside=False):
    """Single-process torch.optim.AdamW on the averaged gradients: params and grad norms per step.
    A suspect's replay (SUSPECTS): ``summed`` feeds the sum over the ranks, not the average;
    ``count="optimizer"`` corrects every parameter's bias with the optimizer's step count;
    ``eps_inside`` adds eps inside the square root (EpsInsideAdamW)."""
    params = [[p.clone().requires_grad_(True) for p in ps] for ps in make_params(seed, groups)]
    pg = [{"params": ps, **opts} for ps, (_, opts) in zip(params, groups)]
    kw = dict(kwargs)
    max_norm = kw.pop("max_grad_norm", None)
    opt = (EpsInsideAdamW if eps_inside else torch.optim.AdamW)(pg, **kw)
    out = []
    for step in range(steps):
        for gi, ps in enumerate(params):
            for pi, p in enumerate(ps):
                gs = [make_grad(seed, rank_of(r), step, gi, pi, p.shape) if has_grad(none, r, step, gi, pi)
                      else torch.zeros(p.shape) for r in range(W)]
                any_grad = any(has_grad(none, r, step, gi, pi) for r in range(W))
                p.grad = torch.stack(gs).sum(0) / (1 if summed else W) if any_grad else None
        with_grad = [p for ps in params for p in ps if p.grad is not None]
        if with_grad:
            norm = torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in with_grad]).double())
        else:
            norm = torch.tensor(0.0)
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
        if count == "optimizer":  # AdamW adds 1 to state["step"] before its update
            for p in with_grad:
                opt.state[p].setdefault("exp_avg", torch.zeros_like(p))
                opt.state[p].setdefault("exp_avg_sq", torch.zeros_like(p))
                opt.state[p]["step"] = torch.tensor(float(step))
        opt.step()
        out.append({"params": torch.cat([p.detach().reshape(-1) for ps in params for p in ps]).clone(),
                    "grad_norm": norm.float()})
    return out


# Bug classes a failing case is replayed with: (name, what the message says, reference() options).
# The test that grades a bug passes its name to run_case (``grades``) and names it; every other
# test passes a result that is exactly that bug's replay (the bug is not its property).
STEP_COUNT = ("bias correction step counted per optimizer or per group, not per parameter: a parameter with no "
              "gradient on any rank in a step must not advance its own step count")
EPS_INSIDE = ("eps is added inside the square root: AdamW divides by sqrt(v_hat) + eps, not sqrt(v_hat + eps) "
              "(v_hat = v / (1 - beta2^t))")
SUMMED = "gradient is W× the average: it is summed over the ranks, never divided by W"
SUSPECTS = (
    ("summed", SUMMED, {"summed": True}),
    ("step count", STEP_COUNT, {"count": "optimizer"}),
    ("eps placement", EPS_INSIDE, {"eps_inside": True}),
)


def check_params(got, want, W, *, what, case):
    """``got`` against ``want`` within tolerance; a failure also says which ranks own the elements
    that differ (rank r owns flat elements [r*c, min((r+1)*c, N)), c = ceil(N/W))."""
    try:
        assert_close(got, want, atol=ATOL, rtol=RTOL, what=what, case=case)
    except AssertionError as e:
        if type(got) is not torch.Tensor or got.shape != want.shape:
            raise
        ok = (got.double() - want.double()).abs() <= ATOL + RTOL * want.double().abs()
        c = -(-want.numel() // W)
        owners = sorted({i // c for i in (~ok).nonzero().flatten().tolist()})
        raise AssertionError(f"{e}; the elements that differ are owned by rank(s) {owners} (c=ceil(N/W)={c})") from None


def check_training(res, ref, *, what, case, check_norm=False, ranks=None, last_only=False):
    """Every rank's parameters after every step (``last_only``: after the last step) against ``ref``:
    the first rank's within tolerance, every other rank's equal to it."""
    ranks = range(len(res)) if ranks is None else ranks
    for step, want in enumerate(ref):
        if last_only and step < len(ref) - 1:
            continue
        first = None
        for r in ranks:
            got = res[r]["steps"][step]
            c = f"{case}, after step {step + 1}, rank {r}"
            if first is None:
                check_params(got["params"], want["params"], len(ranks), what=what, case=c)
                first = got["params"]
            elif not (type(got["params"]) is torch.Tensor and torch.equal(first, got["params"])):
                check_params(got["params"], want["params"], len(ranks), what=what, case=c)
                bad = int((first != got["params"]).sum())
                raise AssertionError(f"parameters differ between ranks ({c}): {bad} elements; after step() every "
                                     "rank must hold the same parameters (all-gather the owned shards)")
            if check_norm:
                gn = got["grad_norm"]
                if not isinstance(gn, torch.Tensor) or gn.dim() != 0 or gn.dtype != torch.float32:
                    raise AssertionError(f"grad_norm must be a 0-dim float32 tensor ({c}), got "
                                         f"{getattr(gn, 'shape', type(gn).__name__)} {getattr(gn, 'dtype', '')}")
                assert_close(gn, want["grad_norm"], atol=1e-6, rtol=1e-5,
                             what="grad_norm is not the global 2-norm of the averaged gradient (before clipping), "
                                  "summed over every shard", case=c)


def check_case(res, replay, grades=(), **kw):
    """check_training against ``replay()`` (the right AdamW). A result that matches the replay of
    a suspect (SUSPECTS) instead fails under that bug's name where the test grades it (its name
    in ``grades``), and passes elsewhere: that bug costs the points of its own test only."""
    try:
        check_training(res, replay(), **kw)
    except AssertionError as e:
        for name, label, opts in SUSPECTS:
            try:
                check_training(res, replay(**opts), **kw)
            except AssertionError:
                continue
            if name not in grades:
                return  # exactly that bug, graded by its own test
            raise AssertionError(f"{label} ({kw['case']}: the result matches torch.optim.AdamW replayed with that "
                                 f"bug). {e}") from None
        raise


def run_case(W, impl, seed, groups, *, steps=3, kwargs=None, none=None, subgroups=None, graded=None, what, case,
             check_norm=False, grades=()):
    """The scenario on W ranks (``subgroups``: the world split into these groups, each its own
    ``group``; ``graded``: the groups checked, default all), checked against the AdamW replay of
    each group. ``grades``: the SUSPECTS this test grades (check_case)."""
    kwargs, none = kwargs or {}, none or {}
    try:
        res = run_ranks(body_train, W, seed, groups, steps, kwargs, none, world_group=subgroups, norm=check_norm,
                        impl=impl, timeout=T)
    except (RankError, RankTimeout) as e:  # a rank raised or hung: name the property and the case it ran
        raise type(e)(f"{what} ({case}): {e}") from None
    for members in graded or subgroups or [list(range(W))]:
        replay = functools.partial(reference, seed, groups, steps, kwargs, none, len(members),
                                   rank_of=lambda r, m=members: m[r])
        check_case(res, replay, grades=grades, what=what,
                   case=case if subgroups is None else f"{case}, ranks {members}", check_norm=check_norm, ranks=members)
    return res


def _n(groups):
    return sum(math.prod(s) for shapes, _ in groups for s in shapes)


# ============================================================================ Part A: the sharded step

@pytest.mark.part("A")
@pytest.mark.points(3)
@pytest.mark.parametrize("W", [1, 2, 3, 4], ids=lambda w: f"W{w}")
def test_matches_adamw_on_averaged_gradients(W, impl, seed):
    groups = [([(7, 5), (13,), (3, 1)], {})]
    run_case(W, impl, seed, groups, kwargs={"lr": 1e-2, "weight_decay": 0.1},
             what="parameters differ from torch.optim.AdamW fed the gradients averaged over the ranks",
             case=f"W={W}, N={_n(groups)}, 3 steps")


@pytest.mark.part("A")
@pytest.mark.parametrize("W", [2, 4], ids=lambda w: f"W{w}")
def test_gradients_are_averaged_not_summed(W, impl, seed):
    """At eps=0.1 Adam's step depends on the gradient's scale (at 1e-8 a sum would pass)."""
    groups = [([(6, 3), (7,)], {})]
    run_case(W, impl, seed, groups, kwargs={"lr": 1e-2, "eps": 0.1},
             what="parameters differ from torch.optim.AdamW fed the gradients averaged over the ranks (sum / W: "
                  "at eps=0.1 the step size depends on the gradient's scale)", case=f"W={W}, N=25, eps=0.1",
             grades=("summed",))


@pytest.mark.part("A")
@pytest.mark.parametrize("W", [1, 3], ids=lambda w: f"W{w}")
def test_eps_is_added_after_the_square_root(W, impl, seed):
    """eps=0.05 next to sqrt(v_hat) of order 1/sqrt(W): where eps sits in AdamW's denominator,
    sqrt(v_hat) + eps (torch.optim.AdamW) or sqrt(v_hat + eps), shows. One group, W | N (no
    padding), weight_decay=0, every gradient present: nothing else of the step can matter (a
    result that is exactly the summed gradients' replay passes here: the averaging test grades it)."""
    groups = [([(3, 5), (6,)], {})]  # N = 21
    run_case(W, impl, seed, groups, kwargs={"lr": 2e-2, "eps": 0.05, "weight_decay": 0.0}, grades=("eps placement",),
             what="parameters differ from torch.optim.AdamW at a large eps (p -= lr * m_hat / (sqrt(v_hat) + eps), "
                  "v_hat = v / (1 - beta2^t): eps is added after the square root)", case=f"W={W}, N=21, eps=0.05")


PADDED = {  # id: (W, groups), N not a multiple of W; c = ceil(N/W), rank r owns min(c, N - r*c) elements
    "W3-N14": (3, [([(4, 3), (2,)], {})]),  # c=5: rank 2 owns 4, then 1 of padding
    "W4-N14": (4, [([(4, 3), (2,)], {})]),  # c=4: rank 3 owns 2, then 2 of padding
    # c=2, c*(W-1) = 6 > N: rank 2 owns 1 (group 1 ends there), then padding; rank 3 starts past the end
    "W4-N5": (4, [([(2,), (1,)], {}), ([(2,)], {})]),
}


@pytest.mark.part("A")
@pytest.mark.parametrize("W, groups", list(PADDED.values()), ids=list(PADDED))
def test_n_not_divisible_by_w_padding_never_leaks(W, groups, impl, seed):
    N = _n(groups)
    run_case(W, impl, seed, groups, steps=3, kwargs={"lr": 3e-2, "betas": (0.8, 0.99)},
             what="wrong parameters when N is not a multiple of W (padding must never reach a parameter, and more "
                  "than the last rank may be short: rank r owns min(c, N - r*c) elements, maybe none)",
             case=f"W={W}, N={N}, c=ceil(N/W)={-(-N // W)}")


@pytest.mark.part("A")
@pytest.mark.parametrize("shapes", [[(2,), (1,)], [(1,), (1,)]], ids=["N3", "N2"])
def test_a_rank_that_owns_nothing(shapes, impl, seed):
    groups = [(shapes, {})]  # W = 4, c = 1: N=3, rank 3 owns nothing; N=2, ranks 2 and 3 (past the end)
    N = _n(groups)
    run_case(4, impl, seed, groups, kwargs={"lr": 5e-2},
             what="wrong parameters when a rank owns no element", case=f"W=4, N={N} (ranks {N}..3 own nothing)")


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [2, 3], ids=lambda w: f"W{w}")
def test_param_groups_with_their_own_lr_and_weight_decay(W, impl, seed):
    groups = [([(9, 2), (5,)], {"lr": 2e-2, "weight_decay": 0.2}),
              ([(3,)], {"lr": 5e-3, "weight_decay": 0.0, "betas": (0.5, 0.9)}),
              ([(4, 2)], {"eps": 1e-3})]  # N = 34; at W=3 rank 0 owns nothing of groups 1 and 2
    run_case(W, impl, seed, groups, kwargs={"lr": 1e-2, "weight_decay": 0.05},
             what="per-group hyper-parameters not honoured (each element uses its own group's lr, betas, eps, "
                  "weight_decay)", case=f"W={W}, 3 groups, N=34")


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W, rule", [(2, "all"), (3, ("steps", [3]))], ids=["W2-never", "W3-not-in-the-last-step"])
def test_grad_none_on_all_ranks_leaves_param_unchanged(W, rule, impl, seed):
    """Param 1 has no gradient on any rank (never, or in the last step): that step leaves it as it
    was. Step counts cannot matter here (param 1 is never updated after a step without a grad)."""
    groups = [([(6,), (5,), (4,)], {})]
    run_case(W, impl, seed, groups, steps=4, kwargs={"lr": 1e-2, "weight_decay": 0.3}, none={(0, 1): rule},
             what="a parameter whose grad is None on every rank must stay unchanged in that step (no weight decay, "
                  "no momentum)",
             case=f"W={W}, param 1's grad None on every rank {'always' if rule == 'all' else 'in step 4'}")


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W, skipped", [(2, [0, 1]), (3, [1])], ids=["W2-first-grad-in-step-3", "W3-none-in-step-2"])
def test_bias_correction_counts_steps_per_parameter(W, skipped, impl, seed):
    """Param 1 has no gradient on any rank in some steps, then has one again; weight_decay=0, so a
    decayed no-grad step cannot matter here."""
    groups = [([(6,), (5,)], {})]
    run_case(W, impl, seed, groups, steps=4, kwargs={"lr": 1e-2, "weight_decay": 0.0},
             none={(0, 1): ("steps", skipped)},
             what="wrong parameters after steps in which a parameter had no gradient on any rank (its bias correction "
                  "uses its own step count, as torch.optim.AdamW's state['step'])",
             case=f"W={W}, param 1's grad None on every rank in step(s) {[s + 1 for s in skipped]}", grades=("step count",))


def _close(got, want) -> bool:
    """Within the parameters' tolerance, elementwise."""
    return bool(((got - want).abs() <= ATOL + RTOL * want.abs()).all())


def adam_first_update(g, lr, betas, eps, t, eps_inside=False):
    """The update of a parameter's first AdamW step (weight_decay=0, zero moments) with gradient ``g``,
    bias-corrected as step ``t``: -lr * m_hat / (sqrt(v_hat) + eps); at t=1, -lr * g / (|g| + eps).
    ``eps_inside``: the eps-placement suspect's -lr * m_hat / sqrt(v_hat + eps)."""
    (b1, b2), g = betas, g.double()
    v_hat = (1 - b2) * g * g / (1 - b2 ** t)
    return -lr * ((1 - b1) * g / (1 - b1 ** t)) / ((v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps)


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_first_update_of_a_late_parameter_is_adams_first_step(impl, seed):
    """The step-count rule by another observable than the AdamW replay: a parameter whose first
    gradient (on any rank) comes in a later step moves, in that step, by Adam's first bias-corrected
    update, -lr * g / (|g| + eps) (t=1 for it), whatever step the optimizer is on. Group 0's second
    parameter starts in step 4 while its first has a gradient every step (a count per group is
    wrong there), group 1 starts in step 3 (a count per optimizer is wrong there too). W=4, N=20
    (no padding), weight_decay=0, default betas and eps."""
    W, steps, lr, betas, eps = 4, 4, 1e-2, (0.9, 0.999), 1e-8
    groups = [([(7,), (3, 3)], {}), ([(4,)], {})]
    late = {(0, 1): 3, (1, 0): 2}  # (group, param): the 0-based step of its first gradient
    none = {gp: ("steps", list(range(s))) for gp, s in late.items()}
    try:
        res = run_ranks(body_train, W, seed, groups, steps, {"lr": lr, "weight_decay": 0.0}, none, impl=impl,
                        timeout=T)
    except (RankError, RankTimeout) as e:
        raise type(e)(f"W={W}, late parameters: {e}") from None
    offsets, off = {}, 0
    for gi, (shapes, _) in enumerate(groups):
        for pi, s in enumerate(shapes):
            offsets[gi, pi] = (off, off + math.prod(s), s)
            off += math.prod(s)
    for (gi, pi), first in late.items():
        a, b, shape = offsets[gi, pi]
        g = torch.stack([make_grad(seed, r, first, gi, pi, shape) for r in range(W)]).sum(0).reshape(-1) / W
        for r in range(W):
            before, after = (res[r]["steps"][s]["params"][a:b] for s in (first - 1, first))
            case = (f"W={W}, group {gi} param {pi}: grad None on every rank in steps 1..{first}, its first gradient "
                    f"in step {first + 1}, rank {r}")
            got = after.double() - before.double()
            want = adam_first_update(g, lr, betas, eps, 1)
            if _close(got, want) or _close(got, adam_first_update(g, lr, betas, eps, 1, eps_inside=True)):
                continue  # right, or eps inside the root at t=1: test_eps_is_added_after_the_square_root grades that
            ts = [t for t in range(2, steps + 1) if _close(got, adam_first_update(g, lr, betas, eps, t))]
            if ts:
                raise AssertionError(f"{STEP_COUNT} ({case}: its first update was bias-corrected as step t={ts[0]}, "
                                     f"not t=1: -lr * g / (|g| + eps))")
            assert_close(after, (before.double() + want).float(), atol=ATOL, rtol=RTOL, case=case,
                         what="a parameter's first update must be AdamW's first bias-corrected step, "
                              "-lr * g / (|g| + eps) with g its averaged gradient (its own step count is 1)")


@pytest.mark.part("A")
@pytest.mark.parametrize("W", [2, 4], ids=lambda w: f"W{w}")
def test_grad_none_on_some_ranks_counts_as_zero(W, impl, seed):
    groups = [([(5,), (7,)], {})]
    none = {(0, 0): ("ranks", [0]), (0, 1): ("ranks", list(range(1, W)))}
    run_case(W, impl, seed, groups, kwargs={"lr": 2e-2}, none=none,
             what="a grad that is None on some ranks only must count as zeros there (and still be averaged "
                  "over all W ranks)", case=f"W={W}")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_group_is_honoured(impl, seed):
    run_case(4, impl, seed, [([(5, 3), (4,)], {})], steps=2, kwargs={"lr": 1e-2}, subgroups=[[0, 2], [1, 3]],
             what="group not honoured: the average and the ownership must use the ranks of `group` "
                  "(dist.get_rank(group), dist.get_world_size(group)), not the world",
             case="world 4, groups [[0, 2], [1, 3]]")


# ============================================================================ Part B: clipping and grad_norm

@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [1, 2, 3, 4], ids=lambda w: f"W{w}")
def test_clips_by_global_norm_across_shards(W, impl, seed):
    groups = [([(6, 4), (9,)], {}), ([(5,)], {})]
    run_case(W, impl, seed, groups, kwargs={"lr": 1e-2, "max_grad_norm": 0.5}, check_norm=True,
             what="clipping does not match clip_grad_norm_ on the averaged gradient (the norm is global: "
                  "the sqrt of the sum of every shard's squares, not a local, averaged or max norm)",
             case=f"W={W}, N={_n(groups)}, max_grad_norm=0.5")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_grad_norm_and_clipping_honour_group(impl, seed):
    """Where the squares are summed, graded on group [0, 1], whose ranks within the group are its
    world ranks: ownership by world rank (test_group_is_honoured grades it) cannot matter there,
    while a norm over the world or another group shows. Group [2, 3] runs beside it, unchecked."""
    run_case(4, impl, seed, [([(5, 3), (4,)], {})], steps=2, kwargs={"lr": 1e-2, "max_grad_norm": 0.5},
             subgroups=[[0, 1], [2, 3]], graded=[[0, 1]], check_norm=True,
             what="group not honoured by clipping: the norm is the sqrt of the sum of every shard's squares over "
                  "the ranks of `group` only (all_reduce(..., group=group))",
             case="world 4, groups [[0, 1], [2, 3]], max_grad_norm=0.5")


@pytest.mark.part("B")
@pytest.mark.parametrize("W", [2, 3], ids=lambda w: f"W{w}")
def test_no_clipping_below_max_norm(W, impl, seed):
    groups = [([(8,), (3, 3)], {})]
    run_case(W, impl, seed, groups, kwargs={"lr": 1e-2, "max_grad_norm": 1e4},
             what="gradients must be left alone when their global norm is below max_grad_norm (the clip "
                  "coefficient is clamped to 1: never scale gradients up)", case=f"W={W}, max_grad_norm=1e4")


@pytest.mark.part("B")
def test_clips_only_the_steps_above_max_norm(impl, seed):
    """max_grad_norm between the steps' norms: two of the four steps are clipped, two are not. W=1,
    where a rank's shard is the whole gradient: whether the norm sums every shard's squares (the
    global-norm test grades it) cannot change which steps are clipped here."""
    W, groups, steps = 1, [([(6, 4), (9,)], {})], 4
    norms = sorted(float(s["grad_norm"]) for s in reference(seed, groups, steps, {}, {}, W))
    max_norm = (norms[1] + norms[2]) / 2
    run_case(W, impl, seed, groups, steps=steps, kwargs={"lr": 5e-2, "max_grad_norm": max_norm},
             what="only the steps whose global norm exceeds max_grad_norm may be clipped (the clip coefficient "
                  "min(1, max_grad_norm / (norm + 1e-6)) is clamped to 1: never scale gradients up)",
             case=f"W=1, max_grad_norm={max_norm:.4g}, the steps' norms {', '.join(f'{n:.4g}' for n in norms)}")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_grad_norm_is_set_without_clipping(impl, seed):
    """W=1, where a rank's shard is the whole gradient: whether the squares are summed over the
    ranks (the global-norm and group tests grade that) cannot matter here."""
    groups = [([(8,), (3, 3)], {})]
    run_case(1, impl, seed, groups, kwargs={"lr": 1e-2}, check_norm=True,
             what="with max_grad_norm=None: no clipping, and grad_norm still set to the gradient's 2-norm",
             case="W=1, max_grad_norm=None")


# ============================================================================ Part C: memory

def body_memory(rk, seed, small, big, steps, kwargs):
    """The small case, then the big one in the same rank process, its state measured: the small
    case's steps load the code (file-backed pages of the libraries) the big one runs, so the big
    case's growth is the memory its optimizer keeps."""
    return [body_train(rk, seed, small, steps, kwargs, {}),
            body_train(rk, seed + 1, big, steps, kwargs, {}, None, True)]


STATE_MARGIN = 2 * MiB  # allocator and interpreter noise in a rank's live memory (measured: under 0.4 MiB)


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("W, rows", [(2, 3000), (4, 1500)], ids=["W2", "W4"])
def test_optimizer_state_is_sharded(W, rows, impl, seed):
    """State kept between steps, graded on the rank's live memory read from outside it: its
    resident memory (after gc + malloc_trim) after the steps minus before the optimizer was
    made, with the parameters and one step's gradients on both sides. A state of 8N bytes
    (unsharded moments, wherever they are kept) is 23 MiB (W=2) or 11.5 MiB (W=4) on these
    shapes, the reference's 8*ceil(N/W) 11.5 or 2.9 MiB, the bound with its margin 19.3 or 6.4
    MiB; the tensors reachable from the optimizer are a diagnostic (the grade when /proc is
    unreadable)."""
    small = [([(150, 200), (7_001,)], {}), ([(999,)], {})]  # N = 38000
    big = [([(1000, rows), (7_001,)], {}), ([(999,)], {})]  # N = 3M (W=2), 1.5M (W=4)
    N = _n(big)
    steps, kwargs = 2, {"lr": 1e-3}  # default eps: the gradients' average is exact, so no update hangs on it
    res = run_ranks(body_memory, W, seed, small, big, steps, kwargs, impl=impl, timeout=T)
    for i, groups in enumerate((small, big)):
        replay = functools.partial(reference, seed + i, groups, steps, kwargs, {}, W)
        check_case([r[i] for r in res], replay, what="wrong parameters (graded before the memory)",
                   case=f"W={W}, N={_n(groups)}", last_only=i == 1)
    c = -(-N // W)
    bound = 12 * c + 64 * 1024
    for r in range(W):
        growth, walk = res[r][1]["growth"], res[r][1]["state_bytes"]
        inside = (f"tensors reachable from the optimizer hold {walk['total'] / MiB:.1f} MiB (largest: "
                  f"{walk['largest'] or 'none'})")
        if growth is not None:
            ok, figure = growth <= bound + STATE_MARGIN, (
                f"the rank's live memory grew by {growth / MiB:.1f} MiB from before the optimizer was made to after "
                f"{steps} steps (read from /proc, outside the process; gradients and parameters not counted); the "
                f"bound is 12*ceil(N/W) + 64 KiB = {bound / MiB:.1f} MiB, plus {STATE_MARGIN / MiB:.0f} MiB of "
                f"allocator noise; {inside}")
        else:
            ok, figure = walk["total"] <= bound, f"{inside}; the bound is 12*ceil(N/W) + 64 KiB = {bound} bytes"
        if not ok:
            raise AssertionError(f"optimizer state is not sharded (W={W}, N={N}, rank {r}): {figure}. Keep "
                                 "exp_avg/exp_avg_sq only for the elements this rank owns (wherever they are kept: "
                                 "a module-level dict or a closure counts too), and no full-size buffers between "
                                 "steps")


@pytest.mark.part("C")
@pytest.mark.points(0)
def test_communication_volume_per_step(impl, seed, record_perf):
    """Informational: elements passed to collectives per step against ZeRO-1's 2N."""
    W = 2
    groups = [([(40, 25)], {})]
    N = _n(groups)
    res = run_ranks(body_train, W, seed, groups, 2, {"lr": 1e-3}, {}, impl=impl, timeout=T)
    rep = res[0]["steps"][-1]["comm"]
    elems = rep["collective_elems"] + rep["sent_elems"]
    record_perf("zero_comm_elems_vs_2N", elems / (2 * N), elements=elems, N=N, W=W,
                calls=";".join(f"{k}x{v}" for k, v in sorted(rep["collectives"].items())))
