"""Visible tests for lab 04 (Flash Attention): a useful subset of what is graded.

Run them all with `pytest labs/04`, one part with `pytest labs/04 -k part_a`
(part_b, part_c). Without a GPU the Triton kernel runs in the interpreter
(TRITON_INTERPRET=1 is set for you), so shapes here stay small. The hidden
graders use other inputs, more shapes, dtypes and layouts (see README.md).
"""
from __future__ import annotations

import re

import pytest
import torch

from harness.toolkit import AllocationTracker, assert_close, attention, randn, tolerance

# (B, H, Lq, Lk, D, causal): a length off the block size, and Lq != Lk causal
SHAPES = [(1, 2, 8, 8, 16, False), (2, 1, 40, 40, 32, True), (1, 1, 12, 30, 64, True), (1, 1, 30, 12, 16, True)]


def _ids(s):
    return f"B{s[0]}-H{s[1]}-Lq{s[2]}-Lk{s[3]}-D{s[4]}-{'causal' if s[5] else 'full'}"


def _qkv(B, H, Lq, Lk, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (randn((B, H, Lq, D), g, dtype=dtype), randn((B, H, Lk, D), g, dtype=dtype),
            randn((B, H, Lk, D), g, dtype=dtype))


def _check(res, q, k, v, causal, case):
    assert isinstance(res, tuple) and len(res) == 2, "return a tuple (out, lse)"
    out, lse = res
    ref_out, ref_lse = attention(q, k, v, causal)
    assert out.dtype == q.dtype, f"out must have q's dtype {q.dtype}, got {out.dtype}"
    assert lse.dtype == torch.float32, f"lse must be float32, got {lse.dtype}"
    atol, rtol = tolerance(q.dtype, "cpu")
    assert_close(out, ref_out, atol=atol, rtol=rtol, what="out", case=case)
    assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4, what="lse (natural log, float32)", case=case)


# --- Part A ---

@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.part("A")
def test_part_a_matches_naive_attention(impl, shape):
    B, H, Lq, Lk, D, causal = shape
    q, k, v = _qkv(B, H, Lq, Lk, D)
    _check(impl.flash_attention_torch(q, k, v, is_causal=causal, block_q=16, block_k=16), q, k, v, causal, _ids(shape))


@pytest.mark.part("A")
def test_part_a_fully_masked_rows(impl):
    q, k, v = _qkv(1, 1, 10, 4, 16)  # causal, Lq > Lk: queries 0..5 see no key
    out, lse = impl.flash_attention_torch(q, k, v, is_causal=True)
    assert not torch.isnan(out).any(), "NaN in out: guard rows with no key (exp(-inf - -inf))"
    assert out[:, :, :6].eq(0).all(), "fully masked rows must be exact zeros"
    assert torch.isneginf(lse[:, :, :6]).all(), "lse of fully masked rows must be -inf"


@pytest.mark.part("A")
def test_part_a_allocation_bound(impl):
    B, H, Lq, Lk, D = 1, 1, 200, 200, 16
    q, k, v = _qkv(B, H, Lq, Lk, D)
    with AllocationTracker() as t:
        impl.flash_attention_torch(q, k, v, block_q=32, block_k=32)
    bound = max(B * H * 32 * 32, q.numel())
    assert t.max_numel <= bound, (f"allocated {t.max_numel} elements ({t.largest}); the bound is {bound}: "
                                  "keep one (block_q, block_k) tile of scores")


@pytest.mark.part("A")
def test_part_a_bad_dtype_raises(impl):
    q, k, v = _qkv(1, 1, 4, 4, 16)
    try:
        impl.flash_attention_torch(q, k.half(), v)
    except TypeError as e:
        assert re.search(r"\bk\b", str(e)), f"raised TypeError({str(e)!r}); the message should name k"
    else:
        raise AssertionError("flash_attention_torch(q, k.half(), v), k-dtype-differs: expected TypeError naming k, "
                             "nothing was raised (call _check_inputs first)")


# --- Part B ---

@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.part("B")
def test_part_b_matches_naive_attention(impl, shape):
    B, H, Lq, Lk, D, causal = shape
    q, k, v = _qkv(B, H, Lq, Lk, D, seed=1)
    _check(impl.flash_attention_triton(q, k, v, is_causal=causal), q, k, v, causal, _ids(shape))


@pytest.mark.part("B")
def test_part_b_float16_noncontiguous(impl):
    g = torch.Generator().manual_seed(2)
    q = randn((1, 2, 20, 32), g, dtype=torch.float16, layout="strided")
    k = randn((1, 2, 36, 32), g, dtype=torch.float16, layout="transposed")
    v = randn((1, 2, 36, 32), g, dtype=torch.float16)
    _check(impl.flash_attention_triton(q, k, v, is_causal=True), q, k, v, True, "fp16, strided q, transposed k")


# --- Part C ---

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.part("C")
def test_part_c_gradients(impl, causal):
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 24, 40, 16, seed=3))
    dout = torch.randn(1, 2, 24, 16, generator=torch.Generator().manual_seed(4))
    impl.FlashAttentionFunction.apply(q, k, v, causal).backward(dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention(q64, k64, v64, causal)[0].backward(dout.double())
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert got is not None, f"{name} is None: backward must return (dq, dk, dv, None)"
        assert_close(got, want, atol=1e-4, rtol=1e-4, what=name, case="causal" if causal else "full")
