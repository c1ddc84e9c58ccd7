"""Hidden graders, lab 04 Part C: FlashAttentionFunction (backward by recomputation).

Gradients are compared with autograd through harness.oracles.attention in
float64 for the same inputs and the same upstream gradient.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.toolkit import (DTYPES, MiB, assert_close, assert_memory, attention, checked, randn, saved_tensors,
                             tolerance, vjp)

pytestmark = pytest.mark.part("C")

# (B, H, Lq, Lk, D, causal, dtype, layout)
CASES = [
    (1, 1, 1, 1, 16, False, "fp32", "contiguous"),
    (1, 2, 37, 37, 32, True, "fp32", "contiguous"),
    (2, 1, 19, 70, 64, True, "fp32", "strided"),       # Lq < Lk causal
    (1, 2, 70, 19, 16, True, "fp32", "contiguous"),    # Lq > Lk causal: fully masked rows
    (1, 1, 3, 45, 128, False, "fp32", "transposed"),
    (1, 2, 130, 150, 32, True, "fp32", "contiguous"),  # several 64-blocks both ways
    (1, 2, 45, 77, 64, True, "fp16", "contiguous"),
    (1, 2, 77, 45, 32, False, "bf16", "contiguous"),
]


def _params():
    out = []
    for c in CASES:
        B, H, Lq, Lk, D, causal, dt, layout = c
        cid = f"B{B}-H{H}-Lq{Lq}-Lk{Lk}-D{D}-{'causal' if causal else 'full'}-{dt}-{layout}"
        if dt != "bf16":  # on CPU a Part C may run its Part B kernel, whose bf16 tl.dot the interpreter gets wrong
            out.append(pytest.param(c, "cpu", id=cid))
        out.append(pytest.param(c, "cuda", id=cid + "-cuda", marks=pytest.mark.gpu))
    return out


def _leaves(gen, B, H, Lq, Lk, D, dtype, device, layout):
    q = randn((B, H, Lq, D), gen, dtype=dtype, device=device, layout=layout).requires_grad_()
    k = randn((B, H, Lk, D), gen, dtype=dtype, device=device, layout=layout).requires_grad_()
    v = randn((B, H, Lk, D), gen, dtype=dtype, device=device, layout=layout).requires_grad_()
    dout = randn((B, H, Lq, D), gen, dtype=dtype, device=device)
    return q, k, v, dout


def _close(got, want, atol, rtol) -> bool:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return bool(((got - want).abs() <= atol + rtol * want.abs()).all())


def _fa2_grads(q, k, v, dout, causal, allowed, delta=True):
    """dq, dk, dv (float64) of the FlashAttention-2 backward recomputing P = exp(S - lse) from the
    forward's own lse and out but with the mask ``allowed`` (Lq, Lk) on P, and dS = P * (dP - Delta)
    (``delta``) or P * dP: what a backward with that bug returns after a right forward."""
    q, k, v, dout = (t.detach().double() for t in (q, k, v, dout))
    out, lse = attention(q, k, v, causal, None)
    scale = 1.0 / math.sqrt(q.shape[-1])
    lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)                 # empty rows: exp(S - 0)
    p = torch.exp(((q @ k.transpose(-1, -2)) * scale).masked_fill(~allowed, float("-inf")) - lse[..., None])
    dp = dout @ v.transpose(-1, -2)
    ds = p * (dp - (dout * out).sum(-1, keepdim=True)) if delta else p * dp
    return (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, p.transpose(-1, -2) @ dout


def _backward_bug(q, k, v, dout, causal, grads, atol, rtol) -> str | None:
    """The bug class of gradients ``(dq, dk, dv)`` that differ from autograd, if they match one:
    a backward whose mask or dS differs from what its (right) forward did."""
    Lq, Lk = q.shape[2], k.shape[2]
    limit = f"i {'-' if Lq > Lk else '+'} {abs(Lk - Lq)}"                            # bottom-right: j <= limit
    ones = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device)
    mask = ones.tril(Lk - Lq) if causal else ones                                     # the forward's (bottom-right)
    bugs = [(mask, False, "dS lacks the Delta term (dq/dk match dS = P * dP): dq/dk need "
                          "dS = P * (dP - rowsum(dO * O))")]
    if causal:
        bugs.append((ones, True, "backward applies no causal mask while the forward is causal"))
    if causal and Lq != Lk:
        bugs.append((ones.tril(), True, f"backward mask is top-left (query i sees keys 0..i) while the forward is "
                                        f"bottom-right (j <= i + Lk - Lq = {limit})"))
    for allowed, delta, bug in bugs:
        want = _fa2_grads(q, k, v, dout, causal, allowed, delta)
        if all(_close(g, w, atol * max(1.0, w.abs().max().item()), rtol) for g, w in zip(grads, want)):
            return bug
    return None


def _oracle_grads(q, k, v, dout, causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = attention(q64, k64, v64, causal, None)
    out.backward(dout.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


MASKED_NAN = ("{name} has NaN/inf with fully masked rows: recompute P = exp(S - lse) with lse = -inf rows "
              "giving P = 0, not exp(-inf - -inf)")


def _fully_masked_rows_bug(impl, q, k, v, dout, atol, rtol) -> str | None:
    """Causal ``Lq > Lk``: queries ``0 .. Lq-Lk-1`` see no key (lse = -inf) and contribute nothing,
    so the same call without them (a square causal problem over the other rows and every key)
    has the same dk, dv and the same dq for the other rows. When the submission gets that
    smaller call right, gradients that differ on the full one come from the fully masked rows:
    their P was not 0 (an unguarded lse = -inf gives NaN, and zeroing that NaN afterwards drops
    the other rows of its tile). The bug class, else None."""
    Lq, Lk = q.shape[2], k.shape[2]
    sq, sk, sv = (t.detach()[:, :, Lq - Lk:] if t is q else t.detach() for t in (q, k, v))
    sq, sk, sv = (t.clone().requires_grad_() for t in (sq, sk, sv))
    sd = dout[:, :, Lq - Lk:].clone()
    _, grads = vjp(impl.FlashAttentionFunction.apply, (sq, sk, sv, True), sd)
    _, *want = _oracle_grads(sq, sk, sv, sd, True)
    if any(g is None for g in grads[:3]) or not all(
            _close(g, w, atol * max(1.0, w.abs().max().item()), rtol) for g, w in zip(grads[:3], want)):
        return None
    return (f"fully masked rows change the other rows' gradients: queries 0..{Lq - Lk - 1} see no key (lse = -inf), "
            f"and without them the same call gives the right dq, dk, dv; with them the gradients differ: a row "
            f"with lse = -inf must get P = exp(S - lse) = 0 without NaN (guard lse = -inf; a NaN zeroed afterwards "
            f"also drops the other rows of its tile)")


def _check_grads(grads, want, q, k, v, dout, causal, atol, rtol, cid, impl=None):
    """Each of ``grads`` (dq, dk, dv) finite and within tolerance of ``want``, relative to its
    magnitude (grads scale with the values); a failure names the bug class the gradients match,
    if any (with ``impl``, also the fully-masked-rows class, see :func:`_fully_masked_rows_bug`)."""
    masked_rows = causal and q.shape[2] > k.shape[2]
    for name, g in zip(("dq", "dk", "dv"), grads):
        if masked_rows and not torch.isfinite(g).all():
            raise AssertionError(MASKED_NAN.format(name=name) + f" ({cid})")
    tols = [atol * max(1.0, w.abs().max().item()) for w in want]
    bug = None
    if not all(_close(g, w, t, rtol) for g, w, t in zip(grads, want, tols)):
        bug = _backward_bug(q, k, v, dout, causal, grads, atol, rtol)
        if bug is None and masked_rows and impl is not None:
            bug = _fully_masked_rows_bug(impl, q, k, v, dout, atol, rtol)
    for name, got, w, t in zip(("dq", "dk", "dv"), grads, want, tols):
        differs = f"{name} differs from float64 autograd"
        if not bug and name != "dv":
            differs += " (dq/dk need dS = P * (dP - rowsum(dO * O)))"
        assert_close(got, w, atol=t, rtol=rtol, what=f"{bug}; {differs}" if bug else differs, case=cid)


@pytest.mark.points(5)
@pytest.mark.parametrize("case,device", _params())
def test_part_c_gradients_match_float64_autograd(impl, fa, gen, case, device):
    B, H, Lq, Lk, D, causal, dt, layout = case
    dtype = DTYPES[dt]
    cid = fa.case_id(B, H, Lq, Lk, D, causal, dt, layout)
    q, k, v, dout = _leaves(gen, B, H, Lq, Lk, D, dtype, device, layout)
    out, (gq, gk, gv, _) = vjp(impl.FlashAttentionFunction.apply, (q, k, v, causal), dout, forbid=[fa.SDPA],
                               reason="Part C must compute attention itself")
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"apply must return the output tensor, got {type(out).__name__} ({cid})")
    ref_out, dq, dk, dv = _oracle_grads(q, k, v, dout, causal)
    atol, rtol = tolerance(dtype, device)
    assert_close(out, ref_out, atol=atol, rtol=rtol, what="forward output of FlashAttentionFunction", case=cid)
    atol, rtol = tolerance(dtype, device, grad=True)
    for name, got in (("dv", gv), ("dk", gk), ("dq", gq)):
        if got is None:
            raise AssertionError(f"{name} is None: backward must return gradients for q, k and v ({cid})")
        if got.dtype != dtype:
            raise AssertionError(f"{name} has dtype {got.dtype}, expected the input's {dtype} ({cid})")
    _check_grads((gq, gk, gv), (dq, dk, dv), q, k, v, dout, causal, atol, rtol, cid, impl=impl)


def test_part_c_saves_lse_not_probabilities(impl, fa, gen):
    B, H, Lq, Lk, D = 1, 2, 40, 90, 32
    q, k, v, dout = _leaves(gen, B, H, Lq, Lk, D, torch.float32, "cpu", "contiguous")
    out, saved = saved_tensors(impl.FlashAttentionFunction.apply, (q, k, v, True))
    cid = fa.case_id(B, H, Lq, Lk, D, True)
    ref_out, _ = fa.attention(q.detach(), k.detach(), v.detach(), True, None)
    checked(out, ref_out, atol=1e-5, rtol=1e-5, what="forward output of FlashAttentionFunction", case=cid,
            prop="what it saves for backward")
    big = [tuple(t.shape) for t in saved if t.numel() >= B * H * Lq * Lk]
    if big:
        raise AssertionError(f"saved tensors of shape {big} for backward: save lse (B, H, Lq), not the "
                             f"probabilities ({cid})")
    _, ref_lse = fa.attention(q.detach(), k.detach(), v.detach(), True, None)
    for t in saved:
        if tuple(t.shape) == (B, H, Lq) and torch.allclose(t.double(), ref_lse, atol=1e-4, rtol=1e-4):
            return
    raise AssertionError(f"no saved tensor equals the natural-log lse (B, H, Lq) = {(B, H, Lq)}: save it with "
                         f"ctx.save_for_backward (saved shapes: {[tuple(t.shape) for t in saved]}) ({cid})")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_part_c_fully_masked_rows_have_zero_gradients(impl, fa, gen, device):
    B, H, Lq, Lk, D = 1, 2, 50, 17, 16
    q, k, v, dout = _leaves(gen, B, H, Lq, Lk, D, torch.float32, device, "contiguous")
    _, (gq, gk, gv, _) = vjp(impl.FlashAttentionFunction.apply, (q, k, v, True), dout)
    cid = fa.case_id(B, H, Lq, Lk, D, True)
    for name, g in (("dq", gq), ("dk", gk), ("dv", gv)):
        if g is None or not torch.isfinite(g).all():
            raise AssertionError(MASKED_NAN.format(name=name) + f" ({cid})")
    _, dq, dk, dv = _oracle_grads(q, k, v, dout, True)
    atol, rtol = tolerance(torch.float32, device, grad=True)
    if gq[:, :, : Lq - Lk].ne(0).any():
        bug = _backward_bug(q, k, v, dout, True, (gq, gk, gv), atol, rtol)
        rows = gq[:, :, : Lq - Lk].abs().amax(dim=(0, 1, 3)).ne(0).nonzero()[:, 0].tolist()
        raise AssertionError(f"{bug + ': ' if bug else ''}dq of fully masked rows (queries 0..{Lq - Lk - 1}) must "
                             f"be zero; queries {rows[:5]}{'...' if len(rows) > 5 else ''} have non-zero dq ({cid})")
    _check_grads((gq, gk, gv), (dq, dk, dv), q, k, v, dout, True, atol, rtol, cid, impl=impl)


@pytest.mark.points(3)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_part_c_backward_allocates_no_score_matrix(impl, fa, gen, causal):
    # P (and dS) as (Lq, Lk) are 32 MiB each, far above what a tiled backward holds (its tensors,
    # 4 MiB, and a (block_q, block_k) tile); graded on the worker's resident memory read from outside
    B, H, Lq, Lk, D = 1, 8, 1024, 1024, 16
    for _ in range(2):  # the first call (other inputs) warms torch up; the second is graded
        q, k, v, dout = _leaves(gen, B, H, Lq, Lk, D, torch.float32, "cpu", "contiguous")
        res = vjp(impl.FlashAttentionFunction.apply, (q, k, v, causal), dout, measure_backward=True)
    t, (gq, gk, gv, _) = res.measurement, res.grads
    bound = max(B * H * 128 * 128, q.numel(), k.numel(), v.numel())
    cid = fa.case_id(B, H, Lq, Lk, D, causal)
    ref_out, dq, dk, dv = _oracle_grads(q, k, v, dout, causal)
    atol, rtol = tolerance(torch.float32, "cpu")
    checked(res.out, ref_out, atol=atol, rtol=rtol, what="forward output of FlashAttentionFunction", case=cid,
            prop="the backward memory bound")
    atol, rtol = tolerance(torch.float32, "cpu", grad=True)
    for name, got, want in (("dv", gv, dv), ("dk", gk, dk), ("dq", gq, dq)):
        if got is None:
            raise AssertionError(f"{name} is None: backward must return gradients for q, k and v ({cid}); "
                                 "the backward memory bound counts only when the values are right")
        checked(got, want, atol=atol * max(1.0, want.abs().max().item()), rtol=rtol,
                what=f"{name} differs from float64 autograd", case=cid, prop="the backward memory bound")
    io = 4 * 8 * q.numel()  # q, k, v, dout, out and the three gradients, float32
    assert_memory(t, peak_bytes=2 * io + 24 * MiB, largest_numel=bound,
                  what="the backward materialised an (Lq, Lk) matrix (P, dP or dS)", case=cid,
                  hint=f"P alone is {4 * B * H * Lq * Lk / MiB:.0f} MiB: recompute P tile by tile from the saved "
                       "logsumexp")


def test_part_c_bad_args_raise(impl, fa, gen):
    """A refusal counts next to a right answer: the valid neighbour (k in q's dtype) is run
    forward and backward and checked against float64 autograd first."""
    q, k, v, dout = _leaves(gen, 1, 2, 5, 7, 16, torch.float32, "cpu", "contiguous")
    case = "FlashAttentionFunction.apply, k-dtype-differs"
    out, grads = vjp(impl.FlashAttentionFunction.apply, (q, k, v, False), dout)
    ref_out, *want = _oracle_grads(q, k, v, dout, False)
    prop, where = "the TypeError naming k", f"{case}: its valid neighbour"
    atol, rtol = tolerance(torch.float32, "cpu")
    checked(out, ref_out, atol=atol, rtol=rtol, what="forward output of FlashAttentionFunction", case=where, prop=prop)
    atol, rtol = tolerance(torch.float32, "cpu", grad=True)
    for name, got, w in zip(("dq", "dk", "dv"), grads, want):
        if got is None:
            raise AssertionError(f"{name} is None: backward must return gradients for q, k and v ({where}); {prop} "
                                 f"counts only when the values are right")
        checked(got, w, atol=atol * max(1.0, w.abs().max().item()), rtol=rtol,
                what=f"{name} differs from float64 autograd", case=where, prop=prop)
    q, k, v = q.detach(), k.detach().half(), v.detach()
    fa.check_raises(lambda: impl.FlashAttentionFunction.apply(q, k, v, False), TypeError, "k", r"\bk\b", case)
