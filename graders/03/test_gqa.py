"""Hidden graders for lab 03, grouped-query attention (lab-contracts.md, section 03).

In contract order: grouped_query_attention values, head mapping, MQA/MHA,
errors, bottom-right causal masking, gradients (part A); the
GroupedQueryAttention module (part B); the no-repeated-K/V memory rule, the
no-SDPA rule and speed against SDPA (part C). Oracles are float64
(harness.oracles.attention) or torch's own SDPA (square shapes only).
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.toolkit import (MiB, assert_close, assert_memory, attention, call_id, checked, expect_raises, geomean,
                             gradcheck, is_instance, measure_checked, param_grads, randn, timed, tolerance, vjp)

SDPA = "torch.nn.functional.scaled_dot_product_attention"


def _qkv(gen, B, Hq, Hkv, Lq, Lk, D, dtype=torch.float32, layout="contiguous", same_kv_heads=False):
    """Random q, k, v. ``same_kv_heads``: every KV head holds the same K and V (contiguous), so
    which KV head a query head reads cannot matter (the part C rules check values this way)."""
    q = randn((B, Hq, Lq, D), gen, dtype=dtype, layout=layout)
    if same_kv_heads:
        k, v = (randn((B, 1, Lk, D), gen, dtype=dtype).repeat(1, Hkv, 1, 1) for _ in "kv")
        return q, k, v
    k = randn((B, Hkv, Lk, D), gen, dtype=dtype, layout=layout)
    v = randn((B, Hkv, Lk, D), gen, dtype=dtype, layout=layout)
    return q, k, v


# --- Part A: grouped_query_attention ---------------------------------------------------------

# small cases first; lengths off powers of two; (B, Hq, Hkv, Lq, Lk, D, causal, scale, dtype, layout).
# Causal cases here and in the other value tests are square (Lq == Lk): where the mask of a
# Lq != Lk call is aligned is graded once, in test_causal_mask_is_bottom_right_aligned.
# Which KV head a query head reads is graded in test_query_head_uses_kv_head_h_div_group; the
# other part A tests that need 1 < Hkv < Hq name a tiled mapping (h % Hkv) by replaying it
# (_tiled_hint), the causal-mask tests use MQA (Hkv = 1), and parts B and C never depend on it.
VALUE_CASES = [
    (1, 2, 1, 3, 3, 8, False, None, torch.float32, "contiguous"),
    (2, 4, 2, 5, 7, 16, False, None, torch.float32, "strided"),
    (2, 6, 3, 9, 9, 8, True, None, torch.float32, "transposed"),
    (1, 8, 2, 11, 19, 32, False, 0.3, torch.float32, "contiguous"),
    (2, 6, 2, 13, 13, 16, False, 1.7, torch.float32, "strided"),
    (1, 4, 2, 19, 19, 64, True, None, torch.bfloat16, "contiguous"),
    (2, 8, 4, 5, 21, 32, False, None, torch.float16, "contiguous"),
]


def _vid(c):
    B, Hq, Hkv, Lq, Lk, D, causal, scale, dtype, layout = c
    return call_id(B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, D=D, dtype=str(dtype).split(".")[-1]) \
        + ("-causal" if causal else "") + (f"-scale{scale}" if scale else "") + f"-{layout}"


def _head_hint(out, ref, Hq, Hkv, atol, rtol):
    """Name the query heads that are wrong when only some are: a head-mapping bug, not the math."""
    if type(out) is not torch.Tensor or tuple(out.shape) != tuple(ref.shape):
        return ""
    err = ~((out.detach().double() - ref).abs() <= atol + rtol * ref.abs())   # NaN counts as wrong
    bad = [h for h in range(Hq) if bool(err[:, h].any())]
    if not bad or len(bad) == Hq:
        return ""
    G = Hq // Hkv
    kvs = sorted({h // G for h in bad})
    if set(bad) == {h for h in range(Hq) if h // G in kvs}:
        why = f"exactly the query heads of KV heads {kvs}: check how those K/V heads are indexed"
    else:
        why = ("query heads sharing a KV head disagree: check which KV head each one reads (h // G, the "
               "repeat_interleave order) and how the query rows of a group are laid out")
    return f"only query heads {bad} of {Hq} are wrong (Hkv={Hkv}, G={G} query heads per KV head), {why}; "


TILED = "KV heads look tiled ([kv0, kv1, kv0, kv1], h % Hkv)"


def _tiled_message(Hq, Hkv):
    return (f"{TILED}: query head h must use KV head h // (Hq // Hkv) ([kv0, kv0, kv1, kv1], the "
            f"repeat_interleave order; Hq={Hq}, Hkv={Hkv})")


def _tiled(q, k, v, is_causal=False, scale=None):
    """Float64 attention with KV heads tiled (query head h reads KV head h % Hkv): what the
    wrong head mapping computes."""
    G = q.shape[1] // k.shape[1]
    out, _ = attention(q.detach(), k.detach().repeat(1, G, 1, 1), v.detach().repeat(1, G, 1, 1),
                       is_causal=is_causal, scale=scale)
    return out


def _tiled_hint(out, q, k, v, is_causal=False, scale=None, atol=1e-5, rtol=1e-5):
    """The tiled-mapping message (and '; ') when ``out`` is what h % Hkv computes, else ''."""
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hkv in (1, Hq) or type(out) is not torch.Tensor or tuple(out.shape) != tuple(q.shape):
        return ""
    a, t = out.detach().double(), _tiled(q, k, v, is_causal, scale)
    return _tiled_message(Hq, Hkv) + "; " if bool(((a - t).abs() <= atol + rtol * t.abs()).all()) else ""


def _scale_hint(out, q, k, v, is_causal, scale, atol, rtol):
    """The scale bug's message (and '; ') when ``out`` is attention under another scale, else ''."""
    D = q.shape[-1]
    if type(out) is not torch.Tensor or tuple(out.shape) != tuple(q.shape):
        return ""
    if scale is None:
        wrong = [("1/D", 1.0 / D), ("1 (no scaling)", 1.0), ("sqrt(D)", math.sqrt(D))]
        why = "the default scale (scale=None) must be 1/sqrt(D)"
    else:
        wrong = [("1/sqrt(D) (the scale argument ignored)", 1.0 / math.sqrt(D))]
        why = f"scale={scale} must be used as given"
    for label, s in wrong:
        ref, _ = attention(q, k, v, is_causal=is_causal, scale=s)
        if torch.allclose(out.detach().double(), ref, atol=atol, rtol=rtol):
            return f"the scores look scaled by {label}: {why} (D={D}); "
    return ""


@pytest.mark.part("A")
@pytest.mark.points(3)
@pytest.mark.parametrize("case", VALUE_CASES, ids=_vid)
def test_output_matches_float64_oracle(impl, gen, case):
    B, Hq, Hkv, Lq, Lk, D, causal, scale, dtype, layout = case
    q, k, v = _qkv(gen, B, Hq, Hkv, Lq, Lk, D, dtype, layout)
    out = impl.grouped_query_attention(q, k, v, is_causal=causal, scale=scale)
    ref, _ = attention(q, k, v, is_causal=causal, scale=scale)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype, \
        f"wrong output dtype: got {getattr(out, 'dtype', type(out))}, the contract returns q's dtype {dtype}"
    atol, rtol = tolerance(dtype, "cpu")
    tiled = _tiled_hint(out, q, k, v, causal, scale, atol, rtol)
    what = (tiled + "attention output differs from the float64 oracle" if tiled else _scale_hint(
        out, q, k, v, causal, scale, atol, rtol) + _head_hint(out, ref, Hq, Hkv, atol, rtol) + "attention output "
        "differs from the float64 oracle (check the scale, the softmax axis, the causal mask)")
    assert_close(out, ref, atol=atol, rtol=rtol, what=what, case=_vid(case))


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("Hq,Hkv", [(4, 2), (6, 3), (8, 2)], ids=lambda x: str(x))
def test_query_head_uses_kv_head_h_div_group(impl, gen, Hq, Hkv):
    # q = k = 0 gives uniform weights, so query head h outputs exactly the value of its KV head
    B, Lq, Lk, D = 2, 3, 5, 4
    consts = (torch.randperm(50, generator=gen)[:Hkv] + 1).to(torch.float32)   # distinct per KV head
    v = consts.view(1, Hkv, 1, 1).expand(B, Hkv, Lk, D).contiguous()
    q, k = torch.zeros(B, Hq, Lq, D), torch.zeros(B, Hkv, Lk, D)
    out = impl.grouped_query_attention(q, k, v)
    got = out[0, :, 0, 0].float()
    want = consts.repeat_interleave(Hq // Hkv)
    if not torch.allclose(got, want, atol=1e-4, rtol=1e-5):
        tiled = consts.repeat(Hq // Hkv)
        hint = (_tiled_message(Hq, Hkv) if torch.allclose(got, tiled, atol=1e-4, rtol=1e-5)
                else f"wrong query-head to KV-head mapping (Hq={Hq}, Hkv={Hkv})")
        raise AssertionError(f"{hint}: V of KV head i is the constant {consts.tolist()}; "
                             f"query heads got {got.tolist()}, expected {want.tolist()}")


@pytest.mark.part("A")
@pytest.mark.parametrize("kind", ["MQA-Hkv1", "MHA-Hkv=Hq"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mqa_and_mha_are_ordinary_cases(impl, gen, kind, causal):
    B, Hq, Lk, D = 2, 6, 10, 16
    Lq = Lk if causal else 7   # square when causal: the alignment is graded in the causal-mask test
    Hkv = 1 if kind.startswith("MQA") else Hq
    q, k, v = _qkv(gen, B, Hq, Hkv, Lq, Lk, D)
    out = impl.grouped_query_attention(q, k, v, is_causal=causal)
    ref, _ = attention(q, k, v, is_causal=causal)
    assert_close(out, ref, atol=1e-5, rtol=1e-5,
                 what=_head_hint(out, ref, Hq, Hkv, 1e-5, 1e-5) + f"{kind} (Hkv={Hkv}) output differs from the oracle",
                 case=call_id(B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, D=D) + ("-causal" if causal else ""))


def _works(fn, *args, call, **kwargs):
    """``fn(*args, **kwargs)``, the valid neighbour of a refused call: an error it raises fails the
    test (a refusal counts only when the same entry point works on valid arguments)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        if type(e).__module__.startswith("harness."):
            raise
        raise AssertionError(f"the valid neighbour of a refused call raised {type(e).__name__}: {str(e)[:200]} "
                             f"({call}); a refusal counts only when the same call with valid arguments works") from None


def _valid_gqa_neighbour(impl, gen, B, Hq, Hkv, Lq, Lk, D):
    """The refused call's valid neighbour, checked against the oracle (every KV head holds the same
    K/V: the head mapping, graded in its own test, cannot matter)."""
    q, k, v = _qkv(gen, B, Hq, Hkv, Lq, Lk, D, same_kv_heads=True)
    call = call_id(B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, D=D)
    ref, _ = attention(q, k, v)
    checked(_works(impl.grouped_query_attention, q, k, v, call=call), ref, atol=1e-5, rtol=1e-5, case=call,
            what="the valid neighbour of a refused call differs from the float64 oracle", prop="the refusal")


@pytest.mark.part("A")
@pytest.mark.parametrize("Hq,Hkv", [(6, 4), (3, 2), (4, 3)], ids=lambda x: str(x))
def test_non_divisible_head_counts_raise_value_error(impl, gen, Hq, Hkv):
    ok = max(d for d in range(1, Hkv) if Hq % d == 0)  # the neighbour: Hkv lowered to a divisor of Hq
    _valid_gqa_neighbour(impl, gen, 1, Hq, ok, 3, 5, 8)
    q, k, v = _qkv(gen, 1, Hq, Hkv, 3, 5, 8)
    expect_raises(ValueError, f"Hq={Hq}, Hkv={Hkv} (Hq % Hkv != 0: query heads cannot be grouped)",
                  impl.grouped_query_attention, q, k, v)


@pytest.mark.part("A")
def test_empty_keys_raise_value_error(impl, gen):
    _valid_gqa_neighbour(impl, gen, 1, 4, 2, 3, 1, 8)  # Lk=1: the fewest keys allowed
    q, k, v = _qkv(gen, 1, 4, 2, 3, 0, 8)
    expect_raises(ValueError, "Lk=0 (no keys; the contract needs Lk >= 1)", impl.grouped_query_attention, q, k, v)


@pytest.mark.part("A")
def test_mixed_dtypes_raise_type_error(impl, gen):
    _valid_gqa_neighbour(impl, gen, 1, 4, 2, 3, 5, 8)  # all float32
    q, k, v = _qkv(gen, 1, 4, 2, 3, 5, 8)
    expect_raises(TypeError, "q float32, k float64, v float32 (q, k, v must share a dtype)",
                  impl.grouped_query_attention, q, k.to(torch.float64), v)


def _first_mask_error(out, ref, Lq, Lk, first=0):
    """Describe the first query row (from ``first`` on) whose output differs, in mask terms."""
    bad = ((out.double() - ref).abs() > 1e-4).any(-1).any(0).any(0)   # (Lq,)
    bad[:first] = False
    i = int(bad.nonzero()[0, 0])
    return (f"Lq={Lq}, Lk={Lk}: query {i} is wrong; bottom-right alignment lets it see keys "
            f"0..{i + Lk - Lq} (top-left would be 0..{i})" if i + Lk - Lq >= 0 else
            f"Lq={Lq}, Lk={Lk}: query {i} sees no key (j <= {i + Lk - Lq}) and must output zeros")


def _top_left(q, k, v):
    """Float64 attention under a top-left causal mask (query i sees keys 0..i, SDPA's is_causal
    when Lq != Lk): what a wrongly aligned mask computes."""
    G = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    return torch.softmax(s.masked_fill(j > i, float("-inf")), -1) @ v


def _looks_top_left(out, q, k, v, first=0):
    """Whether ``out`` (its query rows from ``first`` on) is what a top-left aligned mask computes."""
    return type(out) is torch.Tensor and out.shape == q.shape and \
        torch.allclose(out.double()[:, :, first:], _top_left(q, k, v)[:, :, first:], atol=1e-5, rtol=1e-5)


def _top_left_message(Lq, Lk):
    allowed = (f"the contract allows keys 0..{Lk - Lq}" if Lq <= Lk else
               f"under the contract queries 0..{Lq - Lk - 1} see no key (zeros) and query {Lq - Lk} sees key 0 only")
    return (f"causal mask looks top-left aligned: Lq={Lq}, Lk={Lk}, query 0 saw key 0 only; {allowed} (bottom-right: "
            f"query i sees key j iff j <= i + Lk - Lq; shift tril's diagonal by Lk - Lq)")


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("Lq,Lk", [(3, 8), (1, 13), (6, 17), (9, 4), (12, 5)],
                         ids=lambda x: str(x))
def test_causal_mask_is_bottom_right_aligned(impl, gen, Lq, Lk):
    """Graded on the queries that see at least one key (i >= Lq - Lk): the rows that see none
    (Lq > Lk) are test_fully_masked_rows_give_zeros_not_nan's, and the alignment shows on the rest."""
    # MQA (Hkv = 1, all 4 query heads in one group): which KV head a query head reads cannot matter
    q, k, v = _qkv(gen, 1, 4, 1, Lq, Lk, 8)
    out = impl.grouped_query_attention(q, k, v, is_causal=True)
    ref, _ = attention(q, k, v, is_causal=True)
    first = max(0, Lq - Lk)   # the first query that sees a key
    shaped = type(out) is torch.Tensor and tuple(out.shape) == tuple(ref.shape)
    try:
        assert_close(out[:, :, first:] if shaped else out, ref[:, :, first:] if shaped else ref, atol=1e-5,
                     rtol=1e-5, what=f"causal output differs (queries {first}..{Lq - 1}, those that see a key)",
                     case=f"Lq={Lq}, Lk={Lk}")
    except AssertionError as e:
        if not shaped or torch.isnan(out[:, :, first:]).any():
            raise
        if _looks_top_left(out, q, k, v, first):
            raise AssertionError(_top_left_message(Lq, Lk)) from None
        raise AssertionError(f"causal mask looks wrong (the contract is bottom-right aligned: query i sees "
                             f"key j iff j <= i + Lk - Lq): {_first_mask_error(out, ref, Lq, Lk, first)}; {e}") from None


@pytest.mark.part("A")
@pytest.mark.parametrize("Lq,Lk", [(5, 2), (8, 1)], ids=lambda x: str(x))
def test_fully_masked_rows_give_zeros_not_nan(impl, gen, Lq, Lk):
    q, k, v = _qkv(gen, 2, 4, 1, Lq, Lk, 8)   # MQA, as in the causal-mask test
    out = impl.grouped_query_attention(q, k, v, is_causal=True)
    n = Lq - Lk   # queries 0..n-1 see no key
    assert not torch.isnan(out).any(), (f"NaN in the output: Lq={Lq}, Lk={Lk}, causal; queries 0..{n - 1} see no "
                                        "key and must output exact zeros (guard the -inf row max)")
    nonzero = (out[:, :, :n] != 0).any(-1).nonzero().tolist()   # (b, h, i) of masked rows that are not zero
    if nonzero:
        if _looks_top_left(out, q, k, v):
            raise AssertionError(_top_left_message(Lq, Lk))
        shown = "; ".join(f"out[{b}, {h}, {i}, :3] = [{', '.join(f'{x:.4g}' for x in out[b, h, i, :3].tolist())}]"
                          for b, h, i in nonzero[:3])
        raise AssertionError(f"fully masked rows must be exact zeros: Lq={Lq}, Lk={Lk}, queries 0..{n - 1} see no "
                             f"key; {len(nonzero)} of {out[:, :, :n].shape[:3].numel()} such rows are not zero: "
                             f"{shown}")
    ref, _ = attention(q, k, v, is_causal=True)
    assert_close(out, ref, atol=1e-5, rtol=1e-5, case=f"Lq={Lq}, Lk={Lk}",
                 what="causal output differs on the rows that see keys (the zero rows count only when the rest "
                      "is right)")


GRAD_CASES = [(1, 4, 2, 5, 5, 8, True), (2, 6, 2, 7, 11, 16, False), (1, 4, 1, 9, 9, 8, True)]  # causal: square


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: call_id(B=c[0], Hq=c[1], Hkv=c[2], Lq=c[3], Lk=c[4],
                                                                    D=c[5]) + ("-causal" if c[6] else ""))
def test_kv_gradients_sum_over_their_query_heads(impl, gen, case):
    B, Hq, Hkv, Lq, Lk, D, causal = case
    q, k, v = (t.requires_grad_() for t in _qkv(gen, B, Hq, Hkv, Lq, Lk, D, layout="strided"))
    dout = randn((B, Hq, Lq, D), gen)
    out, (dq, dk, dv) = vjp(impl.grouped_query_attention, (q, k, v), dout, kwargs=dict(is_causal=causal))
    # oracle: MHA on K/V repeated to Hq heads; a KV head's gradient is the sum over its G query heads
    G = Hq // Hkv
    qd = q.detach().double().requires_grad_()
    kr = k.detach().double().repeat_interleave(G, 1).requires_grad_()
    vr = v.detach().double().repeat_interleave(G, 1).requires_grad_()
    ref, _ = attention(qd, kr, vr, is_causal=causal)
    rdq, rdk, rdv = torch.autograd.grad(ref, (qd, kr, vr), dout.double())
    rdk = rdk.view(B, Hkv, G, Lk, D).sum(2)
    rdv = rdv.view(B, Hkv, G, Lk, D).sum(2)
    case_id = call_id(B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, D=D)
    tiled = _tiled_hint(out, q, k, v, causal)
    if tiled:   # the forward reads the wrong KV heads, so every gradient is wrong: name that bug
        raise AssertionError(f"{tiled}the forward output is that of the tiled mapping, so dq/dk/dv differ "
                             f"({case_id})")
    for name, got, want in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert got is not None, f"no gradient reaches {name[1]}: keep the computation differentiable ({case_id})"
        assert_close(got, want, atol=1e-4, rtol=1e-4, case=case_id,
                     what=f"{name} differs (dK/dV of a KV head must sum the contributions of its "
                          f"{G} query heads)")


@pytest.mark.part("A")
def test_float64_gradcheck(impl, gen):
    q, k, v = (t.double().requires_grad_() for t in _qkv(gen, 1, 4, 2, 4, 4, 5))   # causal: square
    ref, _ = attention(q.detach(), k.detach(), v.detach(), is_causal=True)
    out = impl.grouped_query_attention(q.detach(), k.detach(), v.detach(), is_causal=True)
    checked(out, ref, atol=1e-10, rtol=1e-10, what=_tiled_hint(out, q, k, v, True, None, 1e-10, 1e-10) + "float64 "
            "output differs from the oracle", case="B1-Hq4-Hkv2-Lq4-Lk4-D5-causal-fp64", prop="the gradient check")
    ok = gradcheck(impl.grouped_query_attention, (q, k, v), kwargs=dict(is_causal=True), eps=1e-6, atol=1e-5)
    assert ok, "gradient check against finite differences failed in float64 (B=1, Hq=4, Hkv=2, Lq=4, Lk=4, D=5, " \
               "causal): " \
               "the backward does not match finite differences (a detach, an in-place op, or a float32 cast " \
               "that ignores float64?)"


# --- Part B: GroupedQueryAttention module ----------------------------------------------------

MODULE_CASES = [(32, 4, 2, False), (48, 6, 1, True), (40, 4, 4, True), (64, 8, 2, False)]


def _mid(c):
    return f"d{c[0]}-H{c[1]}-Hkv{c[2]}" + ("-bias" if c[3] else "")


def _module(impl, gen, d_model, n_heads, n_kv_heads, bias):
    m = impl.GroupedQueryAttention(d_model, n_heads, n_kv_heads, bias=bias)
    m.load_state_dict({n: randn(tuple(p.shape), gen, scale=0.2) for n, p in m.state_dict().items()})
    return m


def _module_ref(m, x, H, Hkv, causal, attn=None):
    """Float64 output of the module's own weights: head h is columns [h*hd, (h+1)*hd) of a projection.
    ``attn(q, k, v, is_causal)``: the attention step (default: the float64 oracle)."""
    B, L, d = x.shape
    hd = d // H

    def lin(t, mod):
        y = t @ mod.weight.double().T
        return y if mod.bias is None else y + mod.bias.double()

    def shapes_error(e):
        shapes = {n: tuple(getattr(getattr(m, n, None), "weight", torch.empty(0)).shape)
                  for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
        return AssertionError(f"the projections do not have the contract's shapes (q_proj (H*hd, d), k_proj/v_proj "
                              f"(Hkv*hd, d), o_proj (d, H*hd) weights): got {shapes} ({e})")

    xd = x.double()
    try:
        q = lin(xd, m.q_proj).view(B, L, H, hd).transpose(1, 2)
        k = lin(xd, m.k_proj).view(B, L, Hkv, hd).transpose(1, 2)
        v = lin(xd, m.v_proj).view(B, L, Hkv, hd).transpose(1, 2)
    except (RuntimeError, AttributeError) as e:
        raise shapes_error(e) from None
    y = attention(q, k, v, is_causal=causal)[0] if attn is None else attn(q, k, v, causal)
    try:
        return lin(y.transpose(1, 2).reshape(B, L, H * hd), m.o_proj)
    except (RuntimeError, AttributeError) as e:
        raise shapes_error(e) from None


MODULE_WHAT = ("module output differs from an oracle built from its own weights (head h is columns "
               "[h*head_dim, (h+1)*head_dim) of a projection: view(B, L, H, head_dim).transpose(1, 2))")


def _close(out, ref, atol, rtol):
    return type(out) is torch.Tensor and tuple(out.shape) == tuple(ref.shape) and \
        bool(((out.detach().double() - ref).abs() <= atol + rtol * ref.abs()).all())


def _module_check(impl, m, x, H, Hkv, causal, case, atol=1e-5, rtol=1e-4):
    """``checked``'s oracle for a module output: the float64 oracle of its own weights. An output
    that is the tiled head mapping's (h % Hkv) passes only when the submission's own
    grouped_query_attention tiles on these very inputs (the module's projections of ``x``): part
    A grades that bug, once. Otherwise a tiled output is named as the module's own bug, and any
    other output is graded against the oracle alone (zeros from a garbage function never pass)."""
    def check(out):
        ref = _module_ref(m, x, H, Hkv, causal)
        if _close(out, ref, atol, rtol):
            return
        hint = ""
        if 1 < Hkv < H:
            part_a_tiles = []

            def tiled(q, k, v, c):  # the tiled attention, and whether part A computes it on these q, k, v
                part_a_tiles.append(_part_a_tiles(impl, q.float(), k.float(), v.float(), c))
                return _tiled(q, k, v, c)
            if _close(out, _module_ref(m, x, H, Hkv, causal, attn=tiled), atol, rtol):
                if all(part_a_tiles):
                    return
                hint = f"the module's attention reads the wrong KV heads: {_tiled_message(H, Hkv)}; "
        assert_close(out, ref, atol=atol, rtol=rtol, what=hint + MODULE_WHAT, case=case)
    return check


def _part_a_tiles(impl, q, k, v, causal) -> bool:
    """Whether the submission's grouped_query_attention computes the tiled mapping on ``q, k, v``."""
    try:
        out = impl.grouped_query_attention(q, k, v, is_causal=causal)
    except Exception as e:
        if type(e).__module__.startswith("harness."):
            raise
        return False
    return _close(out, _tiled(q, k, v, causal), 1e-4, 1e-4)


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", MODULE_CASES, ids=_mid)
def test_projection_shapes_follow_head_counts(impl, gen, case):
    d, H, Hkv, bias = case
    m = _module(impl, gen, d, H, Hkv, bias)
    x = randn((2, 5, d), gen)
    checked(m(x), _module_check(impl, m, x, H, Hkv, False, _mid(case) + "-B2-L5"), prop="the projection shapes")
    hd = d // H
    want = {"q_proj": (d, H * hd), "k_proj": (d, Hkv * hd), "v_proj": (d, Hkv * hd), "o_proj": (H * hd, d)}
    for name, (fin, fout) in want.items():
        lin = getattr(m, name, None)
        assert is_instance(lin, torch.nn.Linear), f"{name} must be an nn.Linear submodule ({_mid(case)})"
        assert (lin.in_features, lin.out_features) == (fin, fout), \
            (f"{name} has shape in={lin.in_features}, out={lin.out_features}; expected in={fin}, out={fout} "
             f"({_mid(case)}: k_proj/v_proj have n_kv_heads*head_dim outputs)")
        assert (lin.bias is not None) == bias, f"{name}: bias={lin.bias is not None}, expected bias={bias}"


# (refused, its valid neighbour: the one offending argument made valid)
INVALID_MODULES = [((32, 4, 3), (32, 4, 4)), ((30, 4, 2), (32, 4, 2)), ((32, 0, 1), (32, 1, 1)), ((32, 4, 0), (32, 4, 1))]


@pytest.mark.part("B")
@pytest.mark.parametrize("args, valid", INVALID_MODULES, ids=["d{}-H{}-Hkv{}".format(*a) for a, _ in INVALID_MODULES])
def test_invalid_module_head_counts_raise_value_error(impl, gen, args, valid):
    d, H, Hkv = valid
    call = f"GroupedQueryAttention(d_model={d}, n_heads={H}, n_kv_heads={Hkv})"
    m = _works(_module, impl, gen, d, H, Hkv, False, call=call)
    x = randn((2, 6, d), gen)
    _module_check(impl, m, x, H, Hkv, False, f"{_mid((d, H, Hkv, False))}-B2-L6, the valid neighbour of a refused "
                  "call")(_works(m, x, call=f"{call} on x of shape (2, 6, {d})"))
    d, H, Hkv = args
    expect_raises(ValueError, f"GroupedQueryAttention(d_model={d}, n_heads={H}, n_kv_heads={Hkv}) (head counts >= 1, "
                 "n_heads % n_kv_heads == 0, d_model % n_heads == 0)", impl.GroupedQueryAttention, *args)


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", MODULE_CASES, ids=_mid)
def test_module_forward_matches_oracle_from_its_weights(impl, gen, case, causal):
    d, H, Hkv, bias = case
    m = _module(impl, gen, d, H, Hkv, bias)
    B, L, hd = 2, 7, d // H
    x = randn((B, L, d), gen)
    out = m(x, is_causal=causal)
    _module_check(impl, m, x, H, Hkv, causal, _mid(case) + f"-B{B}-L{L}" + ("-causal" if causal else ""))(out)


@pytest.mark.part("B")
@pytest.mark.parametrize("case", MODULE_CASES[:2], ids=_mid)
def test_module_gradients_reach_every_projection(impl, gen, case):
    d, H, Hkv, bias = case
    m = _module(impl, gen, d, H, Hkv, bias)
    x = randn((2, 6, d), gen)
    out = checked(m(x, is_causal=True), _module_check(impl, m, x, H, Hkv, True, _mid(case) + "-B2-L6-causal"),
                  prop="the gradient flow")
    # loss = sum(out ** 2), so d loss / d out = 2 * out
    vjp(m, (x,), 2 * out, kwargs=dict(is_causal=True))
    md = _module(impl, gen, d, H, Hkv, bias).double()   # same architecture, float64 twin
    md.load_state_dict({n: p.double() for n, p in m.state_dict().items()})
    vjp(md, (x.double(),), 2 * md(x.double(), is_causal=True), kwargs=dict(is_causal=True))
    grads, grads64 = param_grads(m), param_grads(md)
    for name, g in grads.items():
        assert g is not None, f"no gradient reaches {name} ({_mid(case)})"
        assert_close(g, grads64[name], atol=1e-4, rtol=1e-3, what=f"gradient of {name} differs from float64",
                     case=_mid(case))


# --- Part C: memory and performance ----------------------------------------------------------

# Decode shapes where K/V repeated to Hq heads (>= 128 MiB) is several times what the call
# may hold (its inputs, the scores, allocator noise), so the worker's resident memory, read
# from outside the process, shows it however the submission hides it from the tracker.
# Not causal: a causal Lq != Lk call would grade the mask's alignment again before any memory.
# The values checked first use the same K/V in every KV head: the head mapping is part A's.
MEM_CASES = [(1, 32, 2, 1, 16384, 64, False), (2, 32, 2, 4, 8192, 64, False), (1, 32, 2, 3, 16384, 64, False)]


def _memid(c):
    return call_id(B=c[0], Hq=c[1], Hkv=c[2], Lq=c[3], Lk=c[4], D=c[5]) + ("-causal" if c[6] else "")


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", MEM_CASES, ids=_memid)
def test_no_tensor_larger_than_scores_q_or_kv(impl, gen, case):
    B, Hq, Hkv, Lq, Lk, D, causal = case
    limit = max(B * Hq * Lq * Lk, B * Hq * Lq * D, B * Hkv * Lk * D)
    for _ in range(2):  # the first call (other inputs) warms torch up; the second is graded
        q, k, v = _qkv(gen, B, Hq, Hkv, Lq, Lk, D, same_kv_heads=True)
        ref, _ = attention(q, k, v, is_causal=causal)
        _, m = measure_checked(impl.grouped_query_attention, q, k, v, is_causal=causal, no_grad=True, oracle=ref,
                               atol=1e-5, rtol=1e-5, what="decode-shaped output differs", case=_memid(case),
                               prop="the memory bound")
    io = 4 * (2 * q.numel() + k.numel() + v.numel())  # float32 inputs and output
    assert_memory(m, peak_bytes=2 * io + 3 * 4 * B * Hq * Lq * Lk + 32 * MiB, largest_numel=limit,
                  what="K/V materialised at Hq heads (or another oversized temporary)", case=_memid(case),
                  hint=f"K repeated to Hq heads alone is {4 * B * Hq * Lk * D / MiB:.0f} MiB. Do not "
                       "repeat_interleave/expand K or V, and beware matmul broadcasting k.unsqueeze(2) (it copies K)")


@pytest.mark.part("C")
def test_does_not_call_scaled_dot_product_attention(impl, gen):
    q, k, v = _qkv(gen, 1, 4, 2, 5, 5, 16, same_kv_heads=True)   # the head mapping is graded in part A
    ops = set()
    for causal in (False, True):
        ref, _ = attention(q, k, v, is_causal=causal)
        _, t = measure_checked(impl.grouped_query_attention, q, k, v, is_causal=causal, no_grad=True, forbid=[SDPA],
                               reason="lab 03 must implement attention itself", oracle=ref, atol=1e-5, rtol=1e-5,
                               what="output differs from the float64 oracle",
                               case="B1-Hq4-Hkv2-Lq5-Lk5-D16" + ("-causal" if causal else ""),
                               prop="the no-SDPA rule")
        ops |= t.ops
    used = sorted(op for op in ops if "scaled_dot_product" in op)
    assert not used, f"scaled_dot_product_attention reached through {used}: lab 03 must compute attention itself"


PERF_SHAPES = [  # (B, Hq, Hkv, Lq, Lk, D, causal): decode and prefill of a Llama-like layer
    (8, 32, 8, 1, 4096, 128, False),
    (4, 32, 4, 1, 8192, 128, False),
    (2, 32, 8, 1024, 1024, 128, True),
]
# CPU: one decode step of a small layer (2-core CI machines), against SDPA's default CPU
# kernel (the math backend's repeated K/V allocations made its CPU time swing threefold
# in the sandbox's worker). CPU time per call: the reference ~1.3x, a Python loop over
# the 256 (batch, head) pairs ~20-30x.
CPU_PERF_SHAPES = [(8, 32, 8, 1, 128, 64, False)]


def _speed_vs_sdpa(impl, seed, shapes, device, dtype, backend, threshold):
    """Geomean over ``shapes`` of median(grouped_query_attention) / median(SDPA, enable_gqa)
    timed in one process next to the implementation (harness.sandbox.timed: interleaved,
    fresh inputs, cache flush, outside cross-checks); every timed output is checked
    against SDPA computed here. Square causal or Lq = 1 only: SDPA's top-left mask equals
    the contract's bottom-right one there."""
    F = torch.nn.functional
    ratios, figures = [], {}
    atol, rtol = (2e-2, 2e-2) if device == "cuda" else (1e-4, 1e-4)
    for n, (B, Hq, Hkv, Lq, Lk, D, causal) in enumerate(shapes):
        case = _memid((B, Hq, Hkv, Lq, Lk, D, causal))

        def make(i):   # the same K/V in every KV head: the head mapping is graded in part A
            g = torch.Generator().manual_seed(seed + 7919 * i + 104729 * n)
            q = randn((B, Hq, Lq, D), g, dtype=dtype, device=device)
            return (q, *(randn((B, 1, Lk, D), g, dtype=dtype, device=device).repeat(1, Hkv, 1, 1) for _ in "kv"))

        pool = [make(i) for i in range(10)]

        def check(i, out, case=case, causal=causal, pool=pool):
            want = F.scaled_dot_product_attention(*pool[i], is_causal=causal, enable_gqa=True)
            assert_close(out, want, atol=atol, rtol=rtol, what="a timed output is wrong: no performance credit",
                         case=case)

        t = timed(impl.grouped_query_attention, SDPA, pool, warmup_inputs=[make(10 + w) for w in range(3)],
                  check=check, kwargs={"is_causal": causal},
                  baseline_kwargs={"is_causal": causal, "enable_gqa": True},
                  forbid=[SDPA, "torch._C._nn.scaled_dot_product_attention"], forbid_ops=["scaled_dot_product"],
                  reason="lab 03 is timed against SDPA and must not call it", device=device, backend=backend)
        ratios.append(t.ratio)
        figures[f"{case}_ratio"] = t.ratio
        figures[f"{case}_ms"] = t.candidate_s * 1e3
        figures[f"{case}_sdpa_ms"] = t.baseline_s * 1e3
        figures[f"{case}_outside"] = str(t.outside or t.baseline_outside)
    ratio = geomean(ratios)
    assert ratio < threshold.zero_credit, (
        f"grouped_query_attention takes {ratio:.3g}x the time of SDPA ({threshold.baseline}); no performance credit "
        f"at >= {threshold.zero_credit}x, full credit at <= {threshold.full_credit}x: compute all heads of a KV group "
        f"in one batched matmul, never a Python loop over heads ({figures})")
    return ratio, figures


@pytest.mark.gpu
@pytest.mark.perf("gqa_vs_sdpa")
@pytest.mark.part("C")
@pytest.mark.points(3)
def test_speed_against_sdpa_enable_gqa(impl, seed, lab, record_perf):
    ratio, figures = _speed_vs_sdpa(impl, seed, PERF_SHAPES, "cuda", torch.float16, None, lab.perf["gqa_vs_sdpa"])
    record_perf("gqa_vs_sdpa", ratio, **figures)


@pytest.mark.perf("gqa_vs_sdpa_cpu")
@pytest.mark.part("C")
@pytest.mark.points(2)
def test_cpu_speed_against_sdpa(impl, seed, lab, record_perf):
    ratio, figures = _speed_vs_sdpa(impl, seed, CPU_PERF_SHAPES, "cpu", torch.float32, None,
                                    lab.perf["gqa_vs_sdpa_cpu"])
    record_perf("gqa_vs_sdpa_cpu", ratio, **figures)
