"""Shared checks for the lab 04 graders (Flash Attention), given to tests as the
``fa`` fixture (conftest, so it works under ``--import-mode=importlib``).

``fa.qkv(...)`` draws inputs from the test's generator; ``fa.check_forward(...)``
compares ``(out, lse)`` against ``harness.oracles.attention`` in float64 and,
when they differ, names the likely bug class (top-left causal mask, missing or
wrong scale, base-2 lse, NaN or non-zero fully masked rows) before the elements.
``fa.kernel_call(...)`` runs a Part B call under ``harness.sandbox.measure`` and
requires a real kernel: at least one Triton launch, no attention math in PyTorch;
``fa.checked_kernel(...)`` is the call a rule test grades (right in float32 or float16).
``fa.check_deterministic(...)`` compares two calls on equal inputs made in two
processes (``harness.sandbox.restart`` between them), so no memo survives.
``fa.check_refusal(...)`` grades a bad-argument error next to the right answer of its valid
neighbour (through ``kernel_call`` for Part B); ``fa.check_layout(...)`` says when a wrong
result on strided views is right on contiguous copies.
"""
from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch

from harness.toolkit import (DTYPES, assert_close, attention, causal_mask, checked, expect_raises, measure, randn,
                             restart, tolerance)

SDPA = "torch.nn.functional.scaled_dot_product_attention"
# ATen ops (overload names, any in-place "_" dropped) of attention math: a Part B call runs
# none of them outside its kernel (plain PyTorch shows up as bmm/mm/matmul, _softmax, exp)
TORCH_ATTENTION_OPS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear",
                       "einsum", "_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax", "logsumexp",
                       "exp", "exp2"}


def case_id(B, H, Lq, Lk, D, causal, dtype="fp32", layout=None):
    s = f"B{B}-H{H}-Lq{Lq}-Lk{Lk}-D{D}-{'causal' if causal else 'full'}-{dtype}"
    return s + (f"-{layout}" if layout else "")


def qkv(gen, B, H, Lq, Lk, D, dtype=torch.float32, device="cpu", layouts=("contiguous",) * 3, scale=1.0):
    """q (B, H, Lq, D), k and v (B, H, Lk, D) from ``gen`` in the given layouts."""
    q = randn((B, H, Lq, D), gen, dtype=dtype, device=device, layout=layouts[0], scale=scale)
    k = randn((B, H, Lk, D), gen, dtype=dtype, device=device, layout=layouts[1], scale=scale)
    v = randn((B, H, Lk, D), gen, dtype=dtype, device=device, layout=layouts[2])
    return q, k, v


def lse_tolerance(device) -> tuple[float, float]:
    """lse is float32 whatever the input dtype (fp32 accumulation of exact products)."""
    return (2e-3, 2e-3) if str(device).startswith("cuda") else (1e-4, 1e-4)


def _close(a, e, atol, rtol) -> bool:
    try:
        assert_close(a, e, atol=atol, rtol=rtol, what="")
        return True
    except AssertionError:
        return False


def _limit(Lq, Lk) -> str:
    """The bottom-right causal limit of query i, ``"i + 51"`` or ``"i - 51"``."""
    return f"i {'-' if Lq > Lk else '+'} {abs(Lk - Lq)}"


def _diagnose_out(out, q, k, v, is_causal, scale, atol, rtol) -> str | None:
    """The bug class an ``out`` that differs from the oracle matches, if any."""
    Lq, Lk, D = q.shape[2], k.shape[2], q.shape[3]
    s = 1.0 / math.sqrt(D) if scale is None else scale
    if is_causal and Lq != Lk:
        # top-left: query i sees keys 0..i (what SDPA's is_causal does)
        tl_out = _masked_attention(q, k, v, s, torch.ones(Lq, Lk, dtype=torch.bool).tril().to(q.device))
        if _close(out, tl_out, atol, rtol):
            allowed = (f"the contract allows keys 0..{Lk - Lq}" if Lk > Lq else
                       f"under the contract queries 0..{Lq - Lk - 1} see no key (zeros)")
            return (f"causal mask looks top-left aligned (query i saw keys 0..i): with Lq={Lq}, Lk={Lk} query 0 "
                    f"saw key 0 only; {allowed}: query i may attend keys j <= i + (Lk - Lq) = {_limit(Lq, Lk)} "
                    f"(bottom-right)")
    for wrong, name in ((1.0, "no scale at all"), (1.0 / D, "1/D instead of 1/sqrt(D)")):
        if _close(out, attention(q, k, v, is_causal, wrong)[0], atol, rtol):
            return f"softmax scale looks wrong ({name}): scale=None means 1/sqrt(D) = {1 / math.sqrt(D):.4g}"
    if is_causal and Lq > Lk:
        rows = out[:, :, : Lq - Lk]
        if rows.ne(0).any():
            return (f"fully masked rows are not zeros: with Lq={Lq} > Lk={Lk} causal, queries 0..{Lq - Lk - 1} "
                    f"see no key and must output exact zeros (a finite \"minus infinity\" such as -1e4 makes such "
                    f"a row average the values)")
    for tile in TILES:  # the submission's tile sizes are its own: try the usual ones
        for bug, wrong in _tiled_bugs(q, k, v, is_causal, s, tile):
            if _close(out, wrong, atol, rtol):
                return bug
    return None


TILES = (16, 32, 64, 128)


def _tiled_bugs(q, k, v, is_causal, scale, tile):
    """``(bug class, out)`` of known bugs of a blocked online softmax with ``tile`` keys (or
    queries) per block, in float64, where they change the output: the accumulator not rescaled
    by ``alpha`` (``l`` is); the padded keys of a ragged last key block left unmasked (score 0,
    value 0: Triton's ``other=0.0``); a causal loop bound that stops one block early, before the
    diagonal (query block ``i // tile`` sees keys ``< (i // tile) * tile + Lk - Lq``)."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    Lq, Lk = q.shape[2], k.shape[2]
    allowed = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq) if is_causal else torch.ones(Lq, Lk, dtype=torch.bool)
    s = ((q @ k.transpose(-1, -2)) * scale).masked_fill(~allowed, float("-inf"))
    if Lk > tile:
        m = torch.full(s.shape[:-1], float("-inf"), dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros(q.shape, dtype=torch.float64)
        for j0 in range(0, Lk, tile):
            sb = s[..., j0:j0 + tile]
            m_new = torch.maximum(m, sb.amax(-1))
            m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)
            p = torch.exp(sb - m_safe[..., None])
            l = l * torch.exp(m - m_safe) + p.sum(-1)
            acc, m = acc + p @ v[..., j0:j0 + tile, :], m_new              # acc never rescaled
        yield (f"the accumulator is not rescaled when the running max grows (acc = alpha * acc + p @ V; this out "
               f"matches acc without alpha over key blocks of {tile})", acc / torch.where(l == 0, 1.0, l)[..., None])
    pad = -Lk % tile
    if pad and not is_causal:  # (causal masks the padded keys anyway: they lie past every query's limit)
        sp = torch.cat([s, s.new_zeros(*s.shape[:-1], pad)], -1)
        vp = torch.cat([v, v.new_zeros(*v.shape[:-2], pad, v.shape[-1])], -2)
        yield (f"padded keys of a ragged last key block were not masked: with key blocks of {tile} the {pad} keys "
               f"past Lk={Lk} got score 0 and value 0; mask with start_n + offs_n < Lk, not the first block's "
               f"offsets", torch.softmax(sp, -1) @ vp)
    if is_causal and Lq > tile:
        rows = torch.arange(Lq)[:, None]
        early = allowed & (torch.arange(Lk)[None, :] < rows // tile * tile + Lk - Lq)
        yield (f"a causal loop bound skips the diagonal key block: with query blocks of {tile}, query i saw only "
               f"keys < (i // {tile}) * {tile} + Lk - Lq; the last query of a block sees keys up to "
               f"(block end - 1) + Lk - Lq", _masked_attention(q, k, v, scale, early))


def _masked_attention(q, k, v, scale, allowed):
    q, k, v = (t.double() for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v


def check_forward(result, q, k, v, is_causal, scale, case, device, what="out"):
    """Assert ``result == (out, lse)`` matches the float64 oracle for these inputs."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise AssertionError(f"must return a tuple (out, lse), got {type(result).__name__} ({case})")
    out, lse = result
    B, H, Lq, D = q.shape
    for name, t, shape in (("out", out, q.shape), ("lse", lse, (B, H, Lq))):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise AssertionError(f"{name} must have shape {tuple(shape)}, got {got} ({case})")
    if out.dtype != q.dtype:
        raise AssertionError(f"out must have q's dtype {q.dtype}, got {out.dtype} ({case})")
    if lse.dtype != torch.float32:
        raise AssertionError(f"lse must be float32, got {lse.dtype} ({case})")
    ref_out, ref_lse = attention(q, k, v, is_causal, scale)
    if torch.isnan(out).any() or torch.isnan(lse).any():
        where = "out" if torch.isnan(out).any() else "lse"
        hint = (" (a fully masked row: guard exp(-inf - -inf) and l == 0; it must give zeros and lse = -inf)"
                if is_causal and Lq > k.shape[2] else "")
        raise AssertionError(f"NaN in {where}{hint} ({case})")
    atol, rtol = tolerance(q.dtype, device)
    if not _close(out, ref_out, atol, rtol):
        bug = _diagnose_out(out, q, k, v, is_causal, scale, atol, rtol)
        differs = f"{what} differs from float64 attention"
        assert_close(out, ref_out, atol=atol, rtol=rtol, what=f"{bug}; {differs}" if bug else differs, case=case)
    latol, lrtol = lse_tolerance(device)
    if not _close(lse, ref_lse, latol, lrtol):
        bug, finite = None, torch.isfinite(ref_lse).all()
        if finite and _close(lse.double() * math.log(2), ref_lse, latol, lrtol):
            bug = ("lse looks like base 2 (log2-sum-exp2): the contract wants the natural log; convert with "
                   "lse = m + log(l) or multiply a base-2 result by ln 2")
        for wrong, name in ((1.0, "no scale at all"), (1.0 / D, "1/D instead of 1/sqrt(D)")):
            if not bug and finite and _close(lse, attention(q, k, v, is_causal, wrong)[1], latol, lrtol):
                bug = (f"lse: softmax scale looks wrong ({name}); lse = log sum_j exp(scale * q.k_j) with "
                       f"scale=None meaning 1/sqrt(D) = {1 / math.sqrt(D):.4g}")
        differs = "lse differs from float64 log-sum-exp"
        assert_close(lse, ref_lse, atol=latol, rtol=lrtol, what=f"{bug}; {differs}" if bug else differs, case=case)


def check_layout(result, call, q, k, v, is_causal, case, device):
    """:func:`check_forward` of ``result``, a call on non-contiguous ``q, k, v``. When it is
    wrong, ``call(*inputs)`` runs on contiguous copies of the same inputs: a right answer there
    means the result depends on the layout (strides assumed), which the failure then says."""
    try:
        check_forward(result, q, k, v, is_causal, None, case, device)
    except AssertionError as e:
        dense = tuple(t.contiguous() for t in (q, k, v))
        try:
            check_forward(call(*dense), *dense, is_causal, None, f"{case}, contiguous copies", device)
        except AssertionError:
            raise e from None
        raise AssertionError(f"the result depends on the layout: right on contiguous copies of the same q, k, v, "
                             f"wrong on these views; pass t.stride() of every tensor, never assume contiguous "
                             f"strides: {e}") from None


def kernel_call(fn, q, k, v, case, **kwargs):
    """``fn(q, k, v, **kwargs)`` (a Part B function) under ``harness.sandbox.measure``; returns
    its result after checking that the call made no call ``kwargs["forbid"]`` names, launched
    at least one Triton kernel (the worker's launch counter, ``triton_launches``) and ran no
    attention math in PyTorch (``TORCH_ATTENTION_OPS``, the ATen ops the call ran outside its
    kernels)."""
    res, t = measure(fn, q, k, v, alloc=False, ops=True, triton=True, **kwargs)
    math_ops = sorted(op for op in t.ops if op.rstrip("_") in TORCH_ATTENTION_OPS or "scaled_dot_product" in op)
    if t.forbidden_called:
        raise AssertionError(f"called {t.forbidden_called} during the call ({case}): Part B computes attention in "
                             f"its Triton kernel")
    if not t.triton_launches:
        raise AssertionError(f"no Triton kernel ran: the call launched {t.triton_launches or 0} Triton kernels "
                             f"and ran the ATen ops {sorted(t.ops)[:12]} ({case}); Part B is one @triton.jit "
                             f"kernel launched as kernel[grid](...), not PyTorch ops")
    if math_ops:
        raise AssertionError(f"attention computed outside the kernel: the call launched {t.triton_launches} Triton "
                             f"kernel(s) but also ran {math_ops} in PyTorch ({case}); compute the scores, the "
                             f"softmax and P @ V inside the kernel, and launch only it")
    return res


def checked_kernel(fn, gen, case, prop, **kwargs):
    """The call a Part B rule test grades: :func:`kernel_call` of ``fn`` on ``case`` ``(B, H, Lq, Lk,
    D, causal)`` in float32, checked against the oracle, and again in float16 when float32's values
    are wrong (a kernel that computes in float16 only keeps the rule; the value tests grade its
    float32). ``kwargs`` go to ``kernel_call`` (``forbid``): a broken rule fails in any dtype.
    Raises the float32 value error when neither is right: ``prop`` counts only then."""
    B, H, Lq, Lk, D, causal = case
    errors = []
    for dt in ("fp32", "fp16"):
        q, k, v = qkv(gen, B, H, Lq, Lk, D, dtype=DTYPES[dt])
        cid = case_id(B, H, Lq, Lk, D, causal, dt)
        res = kernel_call(fn, q, k, v, cid, is_causal=causal, **kwargs)
        try:
            check_forward(res, q, k, v, causal, None, cid, "cpu")
            return res
        except AssertionError as e:
            errors.append(str(e))
    raise AssertionError(f"{errors[0]}; {prop} counts only when the values are right (in float32 or float16; "
                         f"float16 gave: {errors[1][:300]})")


def check_deterministic(impl, call, qkv, other, oracle, case, first=None):
    """Bitwise determinism across processes: ``call(q, k, v) -> (out, lse)`` (which looks the
    function up on ``impl`` at each call) is run on ``other`` inputs and then on ``qkv`` (by
    ``first`` if given, e.g. ``kernel_call``; checked by ``oracle``) in the current worker,
    then, after ``restart(impl)``, on equal copies of ``qkv`` as the fresh worker's first
    call. No memo, cache or call counter of the first process reaches the second, and their
    call histories differ."""
    call(*other)
    a = checked((first or call)(*qkv), oracle, prop="determinism")
    restart(impl)
    b = call(*(t.clone() for t in qkv))
    if not (isinstance(b, tuple) and len(b) == 2):
        raise AssertionError(f"not deterministic: a second call on equal inputs returned {type(b).__name__}, "
                             f"not (out, lse) ({case})")
    for name, x, y in zip(("out", "lse"), a, b):
        if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
            got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
            raise AssertionError(f"not deterministic: {name} of a second call on equal inputs is {got}, the first "
                                 f"was {tuple(x.shape)} {x.dtype} ({case})")
        if not torch.equal(x, y):
            differ = int((x != y).sum())
            gap = (x.double() - y.double()).abs().nan_to_num(0.0).max().item()
            raise AssertionError(
                f"not deterministic: two calls on equal inputs gave different {name} ({differ} of {x.numel()} "
                f"elements, max abs difference {gap:.3g}) ({case}); the second call was the first of a fresh "
                f"process, the first came after another call: the result must depend on the inputs only (no "
                f"random noise, no call counter, no atomic accumulation), and a memo of an earlier result does "
                f"not survive a new process")


def near_minus_1e6(gen, B, H, Lq, Lk, dtype=torch.float32, device="cpu"):
    """Inputs (D=16, scale 1/4) whose logits are -2**20 + t, t a multiple of 1/8 in about
    [-15, 15]: exact in float32, so only the algorithm (a finite sentinel, no max
    shift, underflow) can go wrong. v is +-1 so out errors are bounded by weight errors."""
    D = 16
    q = torch.randint(-2, 3, (B, H, Lq, D), generator=gen).float()
    k = torch.randint(-4, 5, (B, H, Lk, D), generator=gen).float() / 2
    q[..., 0], k[..., 0] = 2048.0, -2048.0
    v = torch.randint(0, 2, (B, H, Lk, D), generator=gen).float() * 2 - 1
    return tuple(t.to(dtype).to(device) for t in (q, k, v))


def check_near_minus_1e6(result, q, k, v, case):
    """Output within float32 resolution of logits near -1e6 (|error| ~ 4% per weight)."""
    out, lse = result
    ref_out, ref_lse = attention(q, k, v, False, None)
    if not torch.isfinite(out).all() or not torch.isfinite(lse).all():
        raise AssertionError(f"logits near -1e6 gave NaN or inf: shift by the running max and start it at "
                             f"-inf, not a finite sentinel such as -1e4 ({case})")
    if out.abs().max() == 0:
        raise AssertionError(f"logits near -1e6 underflowed to zeros: exp(s) without subtracting the running "
                             f"max, or a finite sentinel (-1e4) larger than every logit ({case})")
    assert_close(out, ref_out, atol=0.1, rtol=0.0, what="output for logits near -1e6 differs from the "
                 "shifted softmax beyond float32 resolution (a finite sentinel or no max shift?)", case=case)
    assert_close(lse, ref_lse, atol=0.25, rtol=0.0, what="lse for logits near -1e6", case=case)


def check_fully_masked(result, q, k, v, case, device):
    """Causal rows that see no key (bottom-right alignment, Lq > Lk: queries 0..Lq-Lk-1) are
    exact zeros with lse -inf, never NaN; the rest matches the oracle."""
    out, lse = result
    empty = q.shape[-2] - k.shape[-2]
    if torch.isnan(out).any() or torch.isnan(lse).any():
        raise AssertionError(f"NaN for fully masked rows (guard exp(-inf - -inf) and l == 0) ({case})")
    if out[:, :, :empty].ne(0).any():
        raise AssertionError(f"fully masked rows (queries 0..{empty - 1}) must be exact zeros ({case})")
    if not torch.isneginf(lse[:, :, :empty]).all():
        raise AssertionError(f"lse of fully masked rows must be -inf, got {lse[0, 0, :3].tolist()} ({case})")
    check_forward(result, q, k, v, True, None, case, device)


def check_raises(fn, exc, arg, match, case):
    """``fn()`` must raise ``exc`` (:func:`harness.testing.expect_raises`) whose message names
    ``arg`` (regex ``match``)."""
    e = expect_raises(exc, f"{case} (an error naming {arg})", fn)
    assert re.search(match, str(e)), f"{case}: raised {exc.__name__}({str(e)!r}) but the message should name {arg}"


def check_refusal(fn, bad, good, exc, arg, match, case, kernel=False):
    """A refusal counts next to a right answer of the same entry point: ``fn(*good)`` (the
    valid neighbour of the refused inputs, the one offending argument made valid) first, its
    ``(out, lse)`` checked against the oracle (non-causal), then ``fn(*bad)`` must raise
    ``exc`` naming ``arg``. With ``kernel`` (Part B) the neighbour runs through
    :func:`kernel_call` (a Triton launch, no attention math in PyTorch), in float32 and, when
    float32's values are wrong, again in float16 (as :func:`checked_kernel`: a kernel that
    computes in float16 only loses the float32 value tests, not this one)."""
    prop, where = f"the {exc.__name__} naming {arg}", f"{case}: its valid neighbour"
    errors = []
    for inputs in ((good, tuple(t.half() for t in good)) if kernel else (good,)):
        res = kernel_call(fn, *inputs, where) if kernel else fn(*inputs)
        try:
            check_forward(res, *inputs, False, None, f"{where}, {str(inputs[0].dtype)[6:]}", "cpu")
            break
        except AssertionError as e:
            errors.append(str(e))
    else:
        also = f" (float16 gave: {errors[1][:300]})" if len(errors) > 1 else ""
        raise AssertionError(f"{errors[0]}; {prop} counts only when the values are right{also}")
    check_raises(lambda: fn(*bad), exc, arg, match, case)


def _qkv_small(g, Hk=2, D=16):
    """q (1, 2, 5, D), k and v (1, Hk, 7, D), float32."""
    return (torch.randn(1, 2, 5, D, generator=g), torch.randn(1, Hk, 7, D, generator=g),
            torch.randn(1, Hk, 7, D, generator=g))


def _one_changed(qkv, i, change):
    """``(bad, good)``: ``qkv`` with its ``i``-th tensor changed by ``change``, and ``qkv``."""
    return tuple(change(t) if n == i else t for n, t in enumerate(qkv)), qkv


def _int_qkv(g):
    bad = tuple(torch.randint(0, 3, shape, generator=g) for shape in ((1, 2, 5, 16), (1, 2, 7, 16), (1, 2, 7, 16)))
    return bad, tuple(t.float() for t in bad)


def _heads_differ(g):
    q, k, v = _qkv_small(g, Hk=3)
    return (q, k, v), (q, k[:, :2].contiguous(), v[:, :2].contiguous())


def _d48(g):
    bad = _qkv_small(g, D=48)
    return bad, tuple(t[..., :32].contiguous() for t in bad)


BAD_ARGS = [
    # (id, builder(gen) -> (bad q, k, v; their valid neighbour), exception, argument named, regex on the message)
    ("k-dtype-differs", lambda g: _one_changed(_qkv_small(g), 1, torch.Tensor.half), TypeError, "k", r"\bk\b"),
    ("v-dtype-differs", lambda g: _one_changed(_qkv_small(g), 2, torch.Tensor.double), TypeError, "v", r"\bv\b"),
    ("q-int-dtype", _int_qkv, TypeError, "q", r"\bq\b"),
    ("v-length-differs", lambda g: _one_changed(_qkv_small(g), 2, lambda v: v[:, :, :6]), ValueError, "v", r"\bv\b"),
    ("k-heads-differ", _heads_differ, ValueError, "k", r"\bk\b"),
    ("q-3d", lambda g: _one_changed(_qkv_small(g), 0, lambda q: q[0]), ValueError, "q", r"\bq\b"),
    ("D48-unsupported", _d48, ValueError, "D=48", r"48"),
]


@pytest.fixture
def fa():
    """The shared lab 04 checks (see the module docstring)."""
    return SimpleNamespace(case_id=case_id, qkv=qkv, check_forward=check_forward, near_minus_1e6=near_minus_1e6,
                           check_near_minus_1e6=check_near_minus_1e6,
                           check_fully_masked=check_fully_masked, check_raises=check_raises,
                           check_refusal=check_refusal, check_layout=check_layout,
                           kernel_call=kernel_call, checked_kernel=checked_kernel,
                           check_deterministic=check_deterministic, BAD_ARGS=BAD_ARGS, SDPA=SDPA,
                           causal_mask=causal_mask, attention=attention)


def pytest_generate_tests(metafunc):
    """``bad_arg`` params: one per BAD_ARGS entry, with its id."""
    if "bad_arg" in metafunc.fixturenames:
        metafunc.parametrize("bad_arg", BAD_ARGS, ids=[b[0] for b in BAD_ARGS])
