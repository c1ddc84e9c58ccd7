"""Hidden graders for lab 14, Part C: the distillation losses.

Oracles are the closed forms in float64 (``_closed``), written apart from the reference: per-token
divergences from ``log_softmax`` of both sides, averaged over the valid tokens. Each test grades
one rule: the divergence's value, the token-level mean and the mask, gradients, stability, the
GKD mixture and endpoints, Hinton's weighting, dtypes, errors.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.toolkit import assert_close, expect_raises, vjp

LOSSES = ["forward_kl", "reverse_kl", "generalized_jsd", "distillation_loss"]


def _closed(name, s, t, labels=None, T=1.0, beta=0.5, alpha=0.5, ignore=-100):
    """The float64 closed form of ``name`` (autograd-able in ``s``)."""
    s64, t64 = s.to(torch.float64), t.detach().to(torch.float64)
    ls, lt = torch.log_softmax(s64 / T, -1), torch.log_softmax(t64 / T, -1)
    ps, pt = ls.exp(), lt.exp()
    valid = torch.ones(s.shape[:-1], dtype=torch.bool) if labels is None else labels != ignore
    fkl = (pt * (lt - ls)).sum(-1)
    if name == "forward_kl":
        per = fkl
    elif name == "reverse_kl":
        per = (ps * (ls - lt)).sum(-1)
    elif name == "generalized_jsd":
        if beta == 0:
            per = fkl
        elif beta == 1:
            per = (ps * (ls - lt)).sum(-1)
        else:
            lm = torch.logaddexp(lt + math.log(beta), ls + math.log(1 - beta))   # log M without underflow
            per = beta * (pt * (lt - lm)).sum(-1) + (1 - beta) * (ps * (ls - lm)).sum(-1)
    else:
        nll = -torch.log_softmax(s64, -1).gather(-1, torch.where(valid, labels, 0)[..., None]).squeeze(-1)
        count = max(int(valid.sum()), 1)
        soft = (fkl * valid).sum() / count
        return alpha * T * T * soft + (1 - alpha) * (nll * valid).sum() / count
    return (per * valid).sum() / max(int(valid.sum()), 1)


def _call(impl, name, s, t, labels=None, **kw):
    fn = getattr(impl, name)
    if name == "distillation_loss":
        return fn(s, t, labels, **kw)
    return fn(s, t, labels=labels, **kw)


def _labels(gen, shape, V, pad=0.3):
    """Random labels, a fraction ``pad`` ignored; in each row the first token counts and the last is padding
    (so the valid count is neither the batch size nor every position)."""
    lab = torch.randint(0, V, shape, generator=gen)
    lab = lab.masked_fill(torch.rand(shape, generator=gen) < pad, -100)
    lab[..., -1] = -100
    lab[..., 0] = torch.randint(0, V, lab[..., 0].shape, generator=gen)
    if len(shape) > 1 and shape[-1] > 2:
        lab[0, 1] = 1                     # one more valid token than rows
    return lab


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("name", LOSSES)
def test_loss_value_is_the_token_mean_of_the_divergence(impl, gen, name):
    """The value against the float64 closed form (rtol 1e-5, atol 1e-6) at temperature 2, with padding:
    KL not the soft-target cross-entropy, the mean over the VALID tokens (never the batch size, the padded
    length or V); a 0-dim float32 tensor."""
    B, L, V = 3, 5, 11
    s, t = torch.randn(B, L, V, generator=gen) * 2, torch.randn(B, L, V, generator=gen) * 2
    lab = _labels(gen, (B, L), V)
    kw = {"temperature": 2.0}
    got = _call(impl, name, s, t, lab, **kw)
    want = _closed(name, s, t, lab, T=2.0)
    if isinstance(got, torch.Tensor) and got.dim() == 0 and not math.isclose(float(got), float(want), rel_tol=1e-5,
                                                                              abs_tol=1e-6):
        n_valid = int((lab != -100).sum())
        ratio = float(got) / float(want) if float(want) else float("nan")
        hint = ""
        for k, what in ((B, "the batch size"), (B * L, "all positions (padding included)"), (V, "V")):
            if math.isclose(ratio, n_valid / k, rel_tol=1e-4):
                hint = f"averaged over {what} instead of the {n_valid} valid tokens: "
        if name in ("forward_kl", "distillation_loss") and not hint:
            hint = "the value must be the KL (0 for equal distributions), not the soft-target cross-entropy, " \
                   "at temperature T on both sides: "
        raise AssertionError(f"{hint}{name} = {float(got):.6g}, expected {float(want):.6g} ({B}x{L}x{V}, "
                             f"{n_valid} valid tokens, temperature 2)")
    assert_close(got, want.float(), atol=1e-6, rtol=1e-5, what=f"{name}", case=f"{B}x{L}x{V}, temperature 2")
    assert got.dtype == torch.float32 and got.dim() == 0, f"{name} must return a 0-dim float32 tensor"


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("name", LOSSES)
def test_gradients_match_and_ignored_tokens_get_none(impl, gen, name):
    """``d loss / d student_logits`` against the closed form (rtol 1e-4); ignored positions get exactly 0,
    even with logits of +-1e4 there; no gradient reaches the teacher."""
    B, L, V = 2, 6, 7
    s, t = torch.randn(B, L, V, generator=gen), torch.randn(B, L, V, generator=gen)
    lab = _labels(gen, (B, L), V, pad=0.4)
    lab[0, 0] = 3
    lab[1, 1] = -100
    s[1, 1] = 1e4 * torch.sign(torch.randn(V, generator=gen))
    t[1, 1] = -1e4
    sg = s.clone().requires_grad_(True)
    want = torch.autograd.grad(_closed(name, sg, t, lab, T=1.5), sg)[0]
    out, grads = vjp(getattr(impl, name), (s, t, lab), requires_grad=(True, True, False),
                     kwargs={"temperature": 1.5})
    gs, gt = grads[0], grads[1]
    assert gs is not None, f"{name}: no gradient reached student_logits"
    ignored = lab == -100
    leak = gs[ignored].abs().max() if bool(ignored.any()) else torch.tensor(0.0)
    assert float(leak) == 0, f"ignored positions (labels == ignore_index) must get exactly 0 gradient: {name} gave " \
        f"{float(leak):.3g} there (mask the per-token loss, do not multiply NaN/inf by 0)"
    assert_close(gs, want, atol=1e-7, rtol=1e-4, what=f"d {name} / d student_logits", case=f"{B}x{L}x{V}, T 1.5")
    assert gt is None or float(gt.abs().max()) == 0, f"{name}: a gradient reached teacher_logits (detach the teacher)"


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("name", LOSSES)
def test_losses_are_stable_for_huge_logits(impl, gen, name):
    """``log_softmax`` on both sides: logits ~ N(0, 300^2) at temperature 0.25 (softmax underflows) and
    offsets of 1e4 give finite values and gradients equal to the closed form."""
    B, V = 5, 9
    s, t = torch.randn(B, V, generator=gen) * 300, torch.randn(B, V, generator=gen) * 300
    lab = torch.randint(0, V, (B,), generator=gen)
    for case, (ss, tt, T) in {"N(0, 300^2), T 0.25": (s, t, 0.25), "offset 1e4": (s / 100 + 1e4, t / 100 - 1e4, 1.0)}.items():
        got = _call(impl, name, ss, tt, lab, temperature=T)
        want = _closed(name, ss, tt, lab, T=T)
        if isinstance(got, torch.Tensor) and not bool(torch.isfinite(got).all()):
            raise AssertionError(f"{name} is {float(got)} for {case}: compute log_softmax(logits / T) on both sides, "
                                 f"never log(softmax) (numerically unstable)")
        assert_close(got, want.float(), atol=1e-6, rtol=1e-4, what=f"{name} with huge logits (numerically stable)",
                     case=case)


@pytest.mark.part("C")
@pytest.mark.points(3)
def test_gkd_mixes_probabilities_and_has_its_endpoints(impl, gen):
    """``M = beta p_T + (1 - beta) p_S`` weighted ``beta KL(p_T||M) + (1 - beta) KL(p_S||M)`` for beta in
    (0, 1) (TRL), ``beta = 0`` the forward KL, ``beta = 1`` the reverse KL; symmetric at 0.5."""
    B, V = 6, 8
    s, t = torch.randn(B, V, generator=gen) * 2, torch.randn(B, V, generator=gen) * 2
    for beta in (0.0, 0.2, 0.5, 0.9, 1.0):
        got = impl.generalized_jsd(s, t, beta=beta)
        want = _closed("generalized_jsd", s, t, beta=beta)
        if isinstance(got, torch.Tensor) and not math.isclose(float(got), float(want), rel_tol=1e-5, abs_tol=1e-6):
            raise AssertionError(f"generalized JSD at beta={beta} is {float(got):.6g}, expected {float(want):.6g}: "
                                 f"M = beta p_T + (1 - beta) p_S, loss beta KL(p_T||M) + (1 - beta) KL(p_S||M); "
                                 f"beta = 0 is KL(p_T||p_S) and beta = 1 is KL(p_S||p_T) (GKD Eq. 1, TRL)")
    a, b = impl.generalized_jsd(s, t, beta=0.5), impl.generalized_jsd(t, s, beta=0.5)
    assert math.isclose(float(a), float(b), rel_tol=1e-5), "the generalized JSD must be symmetric at beta = 0.5"


@pytest.mark.part("C")
@pytest.mark.points(3)
def test_distillation_weights_the_soft_term_by_alpha_t_squared(impl, gen):
    """Hinton et al.: ``alpha * T^2 * forward_kl(T) + (1 - alpha) * CE`` with the hard CE at temperature 1,
    both over the same valid tokens, for several alpha and T."""
    B, L, V = 2, 4, 9
    s, t = torch.randn(B, L, V, generator=gen) * 2, torch.randn(B, L, V, generator=gen) * 2
    lab = _labels(gen, (B, L), V)
    for alpha, T in ((0.3, 2.0), (0.8, 4.0), (1.0, 0.5), (0.0, 3.0)):
        got = impl.distillation_loss(s, t, lab, temperature=T, alpha=alpha)
        want = _closed("distillation_loss", s, t, lab, T=T, alpha=alpha)
        if not math.isclose(float(got), float(want), rel_tol=1e-5, abs_tol=1e-6):
            raise AssertionError(f"distillation_loss (alpha={alpha}, T={T}) = {float(got):.6g}, expected "
                                 f"{float(want):.6g}: alpha weights the soft term, T^2 multiplies only the soft term, "
                                 f"the hard cross-entropy is at temperature 1")


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_no_valid_token_is_a_finite_zero(impl, gen):
    """Every label ignored: each loss is 0 (not NaN) and its gradient is 0."""
    s, t = torch.randn(2, 3, 5, generator=gen), torch.randn(2, 3, 5, generator=gen)
    lab = torch.full((2, 3), -100)
    for name in LOSSES:
        out, grads = vjp(getattr(impl, name), (s, t, lab), 
                         requires_grad=(True, False, False))
        assert float(out) == 0.0, f"with no valid token {name} must be a finite 0, got {float(out)} (divide by " \
            f"max(count, 1))"
        assert grads[0] is None or float(grads[0].abs().max()) == 0, f"{name}: nonzero gradient with no valid token"


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_low_precision_logits_are_upcast(impl, gen):
    """bfloat16 student and teacher: float32 result within rtol 1e-4 of the closed form on the same rounded
    inputs (upcast before log_softmax); float64 in, float64 out at 1e-10."""
    s, t = torch.randn(4, 6, 13, generator=gen) * 3, torch.randn(4, 6, 13, generator=gen) * 3
    for name in LOSSES[:3]:
        got = _call(impl, name, s.bfloat16(), t.bfloat16(), None, temperature=1.0)
        want = _closed(name, s.bfloat16(), t.bfloat16())
        assert got.dtype == torch.float32, f"{name} of bfloat16 logits must return float32 (upcast before log_softmax), got {got.dtype}"
        assert_close(got, want.float(), atol=1e-6, rtol=1e-4, what=f"{name} of bfloat16 logits (upcast before "
                     f"log_softmax)", case="4x6x13")
        got = _call(impl, name, s.double(), t.double(), None, temperature=1.0)
        assert got.dtype == torch.float64, f"{name} of float64 logits must return float64"
        assert_close(got, want.new_tensor(float(_closed(name, s, t))), atol=1e-10, rtol=1e-10,
                     what=f"{name} in float64", case="4x6x13")


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_losses_refuse_bad_arguments(impl, gen):
    s, t = torch.randn(2, 3, 5, generator=gen), torch.randn(2, 3, 5, generator=gen)
    lab = torch.randint(0, 5, (2, 3), generator=gen)
    cases = [
        (ValueError, "teacher_logits", "forward_kl", (s, t[:, :2]), {}),
        (ValueError, "labels", "reverse_kl", (s, t), {"labels": lab[:, :2]}),
        (TypeError, "labels", "forward_kl", (s, t), {"labels": lab.float()}),
        (ValueError, "temperature", "forward_kl", (s, t), {"temperature": 0.0}),
        (ValueError, "beta", "generalized_jsd", (s, t), {"beta": 1.5}),
        (ValueError, "alpha", "distillation_loss", (s, t, lab), {"alpha": -0.1}),
        (ValueError, "labels", "distillation_loss", (s, t, None), {}),
        (ValueError, "labels", "distillation_loss", (s, t, lab + 5), {}),
    ]
    for exc, name, fn, args, kw in cases:
        e = expect_raises(exc, f"{fn} with bad {name}", getattr(impl, fn), *args, **kw)
        assert name in str(e), f"{fn} with bad {name} raised {e!r}: the message must name {name}"
