"""Hidden graders for lab 06, weight quantization (lab-contracts.md, section 06).

In contract order: quantize_symmetric, quantize_asymmetric and dequantize
(part A: code ranges and dtypes, round to nearest, the scale/2 error bound,
zero and constant groups, scale shapes, errors, SQNR floors), pack_int4 /
unpack_int4 (part B) and QuantizedLinear (part C: outputs and packed storage).
The grader dequantizes with its own float64 arithmetic, so a quantizer is never
judged by the submission's own dequantize. Works with ``--sandbox none`` and
``--sandbox worker`` (``impl`` a proxy): objects the submission needs (an
``nn.Linear``) are made next to it, stored bytes are read with
``harness.sandbox.held_storages`` and ``state_dict()``, and under the sandbox also as the
worker's live memory (``harness.sandbox.resident_bytes``), which hidden state cannot escape.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.toolkit import (MiB, assert_close, checked, expect_raises, held_storages, is_remote, measure_checked,
                             randn, resident_bytes)


def _gsize(in_f, group_size):
    return in_f if group_size is None else group_size


def _deq64(codes, scale, zp, g):
    """Grader's dequantize in float64: (codes - zp) * scale per group of g columns."""
    out_f, in_f = codes.shape
    c = codes.to(torch.float64).reshape(out_f, in_f // g, g)
    if zp is not None:
        c = c - zp.to(torch.float64)[..., None]
    return (c * scale.to(torch.float64)[..., None]).reshape(out_f, in_f)


def _per_elem(t, g):
    return t.to(torch.float64).repeat_interleave(g, dim=1)


def _near_tie(x, eps=1e-4):
    return ((x - torch.floor(x)) - 0.5).abs() < eps


def _near_integer(x, eps=1e-4):
    """Where truncation may differ between float32 and float64 (w / scale next to an integer)."""
    return (x - torch.round(x)).abs() < eps


def _check_bound(w, deq, scale, g, case, kind):
    w64 = w.to(torch.float64)
    err = (w64 - deq).abs()
    bound = _per_elem(scale, g) / 2 + 1e-6 * w64.abs()
    bad = err > bound
    if bad.any():
        i = int(bad.flatten().nonzero()[0, 0])
        r, c = divmod(i, w.shape[1])
        raise AssertionError(
            f"{kind}: |w - dequantize(quantize(w))| exceeds scale/2 at {int(bad.sum())} of {w.numel()} elements "
            f"(round to nearest, not truncation; clamp only at the range ends) ({case}); first at [{r}, {c}]: "
            f"w={w64[r, c].item():.6g}, dequantized {deq[r, c].item():.6g}, scale/2={bound[r, c].item():.3g}")


def _sym_ref(w, bits, gs):
    """Oracle of symmetric RTN in float64: (scale (out, n), t = w / scale per element, qmax)."""
    out_f, in_f = w.shape
    g, qmax = _gsize(in_f, gs), 2 ** (bits - 1) - 1
    scale = w.to(torch.float64).abs().reshape(out_f, in_f // g, g).amax(-1) / qmax
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale, w.to(torch.float64) / _per_elem(safe, g), qmax


def _scale_matches(scale, ref, rtol, what, case):
    """``scale`` equals ``ref`` (an all-zero group may have any scale: the tests check it is finite)."""
    if type(scale) is torch.Tensor and tuple(scale.shape) == tuple(ref.shape):
        scale = torch.where(ref == 0, ref, scale.detach().to(torch.float64))
    assert_close(scale, ref, atol=0, rtol=rtol, what=what, case=case)


def _shown(t, bad, n=3):
    """The first ``n`` elements of ``t`` where ``bad`` holds, as "[i, j] = value"."""
    return ", ".join(f"{list(ix)} = {t[tuple(ix)].item():.6g}" for ix in bad.nonzero()[:n].tolist())


def _codes_match(codes, want, t, case, what, known=()):
    """Integer ``codes`` equal ``want`` away from rounding ties of ``t`` (float64 vs float32 may
    round a tie either way). ``known``: (bug class, the codes that bug gives); the first that
    explains every wrong code names the failure."""
    if type(codes) is not torch.Tensor or tuple(codes.shape) != tuple(want.shape):
        assert_close(codes, want, atol=0, rtol=0, what=what, case=case)  # names the type or shape
    c = codes.to(torch.float64)
    bad = (c != want) & ~_near_tie(t)
    if bad.any():
        i = int(bad.flatten().nonzero()[0, 0])
        r, col = divmod(i, want.shape[1])
        headline = next((bug for bug, wrong in known if bool(((c == wrong) | _near_integer(t))[bad].all())), what)
        raise AssertionError(f"{headline}: {int(bad.sum())} of {want.numel()} differ ({case}); at [{r}, {col}] "
                             f"w/scale={t[r, col].item():.4f}, code {int(c[r, col])}, round-to-nearest "
                             f"{int(want[r, col])}")


TRUNCATED = "codes look truncated (round to nearest, not toward zero)"
STRIDED = ("groups look strided: group j must hold the contiguous columns j*g .. (j+1)*g - 1, the scale of each "
           "matches columns j, j + n, j + 2n, ... (reshape (out, in // g, g), not (out, g, in // g) transposed)")


def _strided(w, g):
    """``w (out, in)`` float64 as ``(out, n, g)`` groups of strided columns j, j + n, ... (the bug STRIDED)."""
    out_f, in_f = w.shape
    return w.to(torch.float64).reshape(out_f, g, in_f // g).transpose(1, 2)


def _scale_bug(scale, ref, known, rtol):
    """The bug class of a ``scale`` that differs from ``ref`` and equals the scale of a known bug
    (``known``: (bug class, that scale)), else None. All-zero groups are left out, as in
    :func:`_scale_matches`."""
    if type(scale) is not torch.Tensor or tuple(scale.shape) != tuple(ref.shape):
        return None
    s = scale.detach().to(torch.float64)
    for bug, wrong in known:
        if bool((wrong != ref).any()) and bool(((s - wrong).abs() <= rtol * wrong.abs())[ref != 0].all()):
            return bug
    return None


ZP_NOT_ADDED = ("zero point never added: codes are clamp(round(w / scale), 0, 2**bits - 1); the contract's codes "
                "are clamp(round(w / scale) + zero_point, ...)")


def _check_symmetric(w, bits, gs, case):
    """A check of quantize_symmetric(w)'s (codes, scale) against the oracle: scale =
    absmax / qmax, codes = round(w / scale) (away from ties)."""
    def check(res):
        if not (isinstance(res, tuple) and len(res) == 2):
            raise AssertionError(f"quantize_symmetric must return (codes, scale), got {type(res).__name__} ({case})")
        codes, scale = res
        ref, t, qmax = _sym_ref(w, bits, gs)
        g = _gsize(w.shape[1], gs)
        amax = w.to(torch.float64).abs().reshape(w.shape[0], -1, g).amax(-1)
        bug = _scale_bug(scale, ref, [(f"scale is absmax / 2**(bits-1) = absmax / {qmax + 1}, not absmax / "
                                       f"(2**(bits-1) - 1) = absmax / {qmax}", amax / (qmax + 1)),
                                      (STRIDED, _strided(w, g).abs().amax(-1) / qmax)], 1e-6)
        _scale_matches(scale, ref, 1e-6, bug or f"scale is not absmax / (2**(bits-1) - 1) = absmax / {qmax}", case)
        _codes_match(codes, torch.round(t).clamp(-qmax, qmax), t, case, "codes are not round(w / scale)",
                     known=[(TRUNCATED, torch.trunc(t).clamp(-qmax, qmax))])
    return check


def _check_asymmetric(w, bits, gs, case):
    """A check of quantize_asymmetric(w)'s (codes, scale, zero_point) against the oracle:
    scale = (max(w, 0) - min(w, 0)) / qmax, zero_point = round(-min(w, 0) / scale),
    codes = clamp(round(w / scale) + zero_point, 0, qmax) (away from ties)."""
    def check(res):
        if not (isinstance(res, tuple) and len(res) == 3):
            raise AssertionError(f"quantize_asymmetric must return (codes, scale, zero_point), got "
                                 f"{type(res).__name__} ({case})")
        codes, scale, zp = res
        out_f, in_f = w.shape
        g, qmax = _gsize(in_f, gs), 2 ** bits - 1
        wg = w.to(torch.float64).reshape(out_f, in_f // g, g)
        lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
        ref = (hi - lo) / qmax
        ws = _strided(w, g)
        no_zero = (wg.amax(-1) - wg.amin(-1)) / qmax
        bug = _scale_bug(scale, ref, [("the range must include 0: scale is (max(w) - min(w)) / (2**bits - 1); the "
                                       "contract's range is [min(w, 0), max(w, 0)]", no_zero),
                                      (STRIDED, (ws.amax(-1).clamp(min=0) - ws.amin(-1).clamp(max=0)) / qmax)], 1e-5)
        _scale_matches(scale, ref, 1e-5, bug or "scale is not (max(w, 0) - min(w, 0)) / (2**bits - 1)", case)
        safe = torch.where(ref == 0, torch.ones_like(ref), ref)
        zt = -lo / safe
        want_zp = torch.round(zt).clamp(0, qmax)
        if type(zp) is torch.Tensor and tuple(zp.shape) == tuple(ref.shape):
            zp_cmp = torch.where(_near_tie(zt) | (ref == 0), want_zp, zp.to(torch.float64))
        else:
            zp_cmp = zp
        assert_close(zp_cmp, want_zp, atol=0, rtol=0, case=case,
                     what="zero_point is not round(-min(w, 0) / scale) (an integer code, so 0 is exact)")
        t = w.to(torch.float64) / _per_elem(safe, g)
        zpe = _per_elem(torch.where(ref == 0, want_zp, zp.to(torch.float64)), g)
        _codes_match(codes, (torch.round(t) + zpe).clamp(0, qmax), t, case,
                     "codes are not clamp(round(w / scale) + zero_point, 0, 2**bits - 1)",
                     known=[(TRUNCATED, (torch.trunc(t) + zpe).clamp(0, qmax)),
                            (ZP_NOT_ADDED, torch.round(t).clamp(0, qmax))])
    return check


SHAPES = [  # (out, in, bits, group_size): small first; in off powers of two where groups allow
    (3, 20, 8, None), (5, 48, 4, 16), (7, 96, 8, 32), (16, 384, 4, 128), (9, 130, 4, None),
]


def _sid(c):
    return f"out{c[0]}-in{c[1]}-bits{c[2]}-" + ("row" if c[3] is None else f"g{c[3]}")


# --- Part A: symmetric quantization ------------------------------------------------------------

@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", SHAPES, ids=_sid)
def test_symmetric_codes_scale_dtypes_shapes_and_range(impl, gen, case):
    out_f, in_f, bits, gs = case
    w = randn((out_f, in_f), gen, scale=0.05, layout="strided")
    codes, scale = checked(impl.quantize_symmetric(w, bits=bits, group_size=gs),
                           _check_symmetric(w, bits, gs, _sid(case)), prop="the code and scale dtypes, shapes and range")
    g, qmax = _gsize(in_f, gs), 2 ** (bits - 1) - 1
    assert codes.dtype == torch.int8 and tuple(codes.shape) == (out_f, in_f), \
        f"codes must be int8 (out, in) = {(out_f, in_f)}, got {codes.dtype} {tuple(codes.shape)} ({_sid(case)})"
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (out_f, in_f // g), \
        (f"scale must be float32 (out, in // g) = {(out_f, in_f // g)} (one per row when group_size=None), "
         f"got {scale.dtype} {tuple(scale.shape)} ({_sid(case)})")
    lo, hi = int(codes.min()), int(codes.max())
    assert -qmax <= lo and hi <= qmax, \
        f"codes outside [-{qmax}, {qmax}] for bits={bits}: min {lo}, max {hi} ({_sid(case)})"


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", SHAPES, ids=_sid)
def test_symmetric_rounds_to_nearest_within_half_scale(impl, gen, case):
    out_f, in_f, bits, gs = case
    w = randn((out_f, in_f), gen, scale=3.0)
    codes, scale = checked(impl.quantize_symmetric(w, bits=bits, group_size=gs),
                           _check_symmetric(w, bits, gs, _sid(case)), prop="the error bound")
    g = _gsize(in_f, gs)
    _check_bound(w, _deq64(codes, scale, None, g), scale, g, _sid(case), "symmetric")


@pytest.mark.part("A")
@pytest.mark.parametrize("bits,gs", [(8, None), (4, 8)], ids=["bits8-row", "bits4-g8"])
def test_symmetric_all_positive_groups(impl, gen, bits, gs):
    w = randn((6, 40), gen).abs() + 0.01
    codes, scale = checked(impl.quantize_symmetric(w, bits=bits, group_size=gs),
                           _check_symmetric(w, bits, gs, f"bits{bits}-all-positive"), prop="the code range")
    g, qmax = _gsize(40, gs), 2 ** (bits - 1) - 1
    assert int(codes.min()) >= 0, f"all-positive weights gave a negative code {int(codes.min())} (bits={bits})"
    assert bool((codes.reshape(6, 40 // g, g).amax(-1) == qmax).all()), \
        f"the largest weight of each group must map to code {qmax} (absmax / scale = {qmax}), bits={bits}"
    _check_bound(w, _deq64(codes, scale, None, g), scale, g, f"bits{bits}", "symmetric, all-positive")


# --- Part A: asymmetric quantization -----------------------------------------------------------

@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", SHAPES, ids=_sid)
def test_asymmetric_codes_zero_point_dtypes_and_ranges(impl, gen, case):
    out_f, in_f, bits, gs = case
    w = randn((out_f, in_f), gen, scale=0.1, layout="transposed") + 0.03
    codes, scale, zp = checked(impl.quantize_asymmetric(w, bits=bits, group_size=gs),
                               _check_asymmetric(w, bits, gs, _sid(case)),
                               prop="the code, scale and zero-point dtypes, shapes and ranges")
    g, qmax = _gsize(in_f, gs), 2 ** bits - 1
    assert codes.dtype == torch.uint8 and tuple(codes.shape) == (out_f, in_f), \
        f"codes must be uint8 (out, in) = {(out_f, in_f)}, got {codes.dtype} {tuple(codes.shape)} ({_sid(case)})"
    n = in_f // g
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (out_f, n), \
        f"scale must be float32 (out, in // g) = {(out_f, n)}, got {scale.dtype} {tuple(scale.shape)} ({_sid(case)})"
    assert zp.dtype == torch.uint8 and tuple(zp.shape) == (out_f, n), \
        f"zero_point must be uint8 shaped like scale {(out_f, n)}, got {zp.dtype} {tuple(zp.shape)} ({_sid(case)})"
    assert int(codes.max()) <= qmax and int(zp.max()) <= qmax, \
        f"codes/zero points above 2**bits - 1 = {qmax}: max code {int(codes.max())}, max zero point {int(zp.max())}"


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", SHAPES, ids=_sid)
def test_asymmetric_round_to_nearest_within_half_scale_and_zero_exact(impl, gen, case):
    out_f, in_f, bits, gs = case
    w = randn((out_f, in_f), gen, scale=2.0) - 0.4
    zero_at = torch.rand(out_f, in_f, generator=gen) < 0.1
    w[zero_at] = 0.0
    codes, scale, zp = checked(impl.quantize_asymmetric(w, bits=bits, group_size=gs),
                               _check_asymmetric(w, bits, gs, _sid(case)), prop="the error bound")
    g = _gsize(in_f, gs)
    deq = _deq64(codes, scale, zp, g)
    _check_bound(w, deq, scale, g, _sid(case), "asymmetric")
    assert bool((deq[zero_at] == 0).all()), \
        (f"0 is not exact: weights equal to 0 dequantize to {deq[zero_at][deq[zero_at] != 0][:3].tolist()} "
         f"({_sid(case)}); the range must include 0 and the zero point must be an integer code")


@pytest.mark.part("A")
@pytest.mark.parametrize("bits,gs", [(4, 8), (8, None)], ids=["bits4-g8", "bits8-row"])
def test_asymmetric_group_with_minimum_zero_has_zero_point_zero(impl, gen, bits, gs):
    w = randn((5, 24), gen).abs()
    w[:, ::8] = 0.0                       # every group (and row) has minimum exactly 0
    codes, scale, zp = checked(impl.quantize_asymmetric(w, bits=bits, group_size=gs),
                               _check_asymmetric(w, bits, gs, f"bits{bits}-minimum-0"), prop="the zero point of a min-0 group")
    g = _gsize(24, gs)
    assert bool((zp == 0).all()), (f"a group whose minimum is 0 must get zero_point 0 (bits={bits}, "
                                   f"{'row' if gs is None else f'g{gs}'}): {_shown(zp, zp != 0)}")
    deq = _deq64(codes, scale, zp, g)
    assert bool((deq[:, ::8] == 0).all()), "zeros of a min-0 group must dequantize to exactly 0"
    _check_bound(w, deq, scale, g, f"bits{bits}", "asymmetric, minimum 0")


@pytest.mark.part("A")
@pytest.mark.parametrize("bits", [4, 8])
def test_asymmetric_all_positive_groups_keep_zero_in_range(impl, gen, bits):
    w = randn((4, 32), gen).abs() + 1.5           # min(w) > 0: the range is [0, max(w)]
    codes, scale, zp = checked(impl.quantize_asymmetric(w, bits=bits, group_size=16),
                               _check_asymmetric(w, bits, 16, f"bits{bits}-g16-all-positive"),
                               prop="the zero point of an all-positive group")
    assert bool((zp == 0).all()), (f"all-positive groups: the range [min(w, 0), max(w, 0)] starts at 0, so the "
                                   f"zero point must be 0 (bits={bits}, g16); {_shown(zp, zp != 0)}")
    _check_bound(w, _deq64(codes, scale, zp, 16), scale, 16, f"bits{bits}-g16", "asymmetric, all-positive")


# --- Part A: zero and constant groups; shapes; errors; dequantize; quality ---------------------

def _special_weight(gen):
    w = randn((5, 32), gen)
    w[0] = 0.0                         # all-zero row
    w[1, :8] = 0.0                     # all-zero group (g = 8)
    w[2, 8:16] = 0.75                  # constant positive group
    w[3, 16:24] = -2.5                 # constant negative group
    w[4] = 0.3                         # constant row
    return w


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("kind", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("bits,gs", [(8, None), (4, 8), (8, 8)], ids=["bits8-row", "bits4-g8", "bits8-g8"])
def test_zero_and_constant_groups_never_make_nan_or_inf(impl, gen, kind, bits, gs):
    w = _special_weight(gen)
    case = f"{kind}-bits{bits}-" + ("row" if gs is None else f"g{gs}")
    prop = "the zero/constant-group rules"
    if kind == "symmetric":
        (codes, scale), m = measure_checked(impl.quantize_symmetric, w, bits=bits, group_size=gs, nonfinite=True,
                                            oracle=_check_symmetric(w, bits, gs, case), prop=prop)
        zp = None
    else:
        (codes, scale, zp), m = measure_checked(impl.quantize_asymmetric, w, bits=bits, group_size=gs,
                                                nonfinite=True, oracle=_check_asymmetric(w, bits, gs, case), prop=prop)
    assert not m.first_nonfinite, (f"NaN/Inf produced while quantizing all-zero/constant groups ({case}): "
                                   f"{m.first_nonfinite}; guard the zero absmax/range (casting NaN to int is undefined)")
    bad_scale = ~torch.isfinite(scale) | (scale < 0)
    assert not bad_scale.any(), \
        f"scale must be 0 or finite positive for zero/constant groups ({case}): {_shown(scale, bad_scale)}"
    g = _gsize(32, gs)
    deq = _deq64(codes, scale, zp, g)
    not_zero = (w == 0) & (deq != 0)
    assert not not_zero.any(), (f"zeros must dequantize to exact zeros ({case}): {int(not_zero.sum())} weights equal "
                                f"to 0 dequantize to {_shown(deq, not_zero)}")
    _check_bound(w, deq, scale, g, case, f"{kind}, constant groups")


@pytest.mark.part("A")
@pytest.mark.parametrize("gs", [None, 5, 40], ids=["row", "g5", "g40"])
def test_scale_shape_per_row_or_per_group(impl, gen, gs):
    # non-negative with a 0 in every group (columns 0, 5, ...): the asymmetric range is [0, max] and
    # the zero point 0, so how codes use the zero point (graded above) cannot matter to the shapes
    w = randn((3, 40), gen).abs()
    w[:, ::5] = 0.0
    n = 1 if gs is None else 40 // gs
    case = "out3-in40-" + ("row" if gs is None else f"g{gs}")
    _, s = checked(impl.quantize_symmetric(w, bits=8, group_size=gs), _check_symmetric(w, 8, gs, case + "-bits8"),
                   prop="the scale shapes")
    _, s2, z2 = checked(impl.quantize_asymmetric(w, bits=4, group_size=gs),
                        _check_asymmetric(w, 4, gs, case + "-bits4"), prop="the scale shapes")
    for name, t in (("symmetric scale", s), ("asymmetric scale", s2), ("zero_point", z2)):
        assert tuple(t.shape) == (3, n), f"{name} shape {tuple(t.shape)}, expected (out, in // g) = (3, {n}) " \
                                         f"for group_size={gs}"


@pytest.mark.part("A")
@pytest.mark.parametrize("gs,good", [(7, 6), (64, 36), (10, 12)], ids=["g7", "g64", "g10"])
def test_group_size_not_dividing_in_raises_value_error(impl, gen, gs, good):
    """A refusal counts next to a right answer: the same call with a group size that divides in
    (``good``, the valid neighbour) is checked against the oracle first. Non-negative weights
    with a 0 in every group: the zero point is 0, so how codes use it (graded above) cannot
    matter here."""
    w = randn((4, 36), gen).abs()
    w[:, ::6] = 0.0
    prop = f"the ValueError for group_size={gs}"
    for name, bits, check in (("quantize_symmetric", 8, _check_symmetric),
                              ("quantize_asymmetric", 4, _check_asymmetric)):
        checked(getattr(impl, name)(w, bits=bits, group_size=good),
                check(w, bits, good, f"{name}, w (4, 36), bits={bits}, group_size={good}: the valid neighbour"),
                prop=prop)
        expect_raises(ValueError, f"{name}(w (4, 36), bits={bits}, group_size={gs}) (36 % {gs} != 0)",
                      getattr(impl, name), w, bits=bits, group_size=gs)


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("gs", [None, 6], ids=["row", "g6"])
def test_dequantize_matches_formula(impl, gen, gs):
    out_f, in_f = 4, 18
    n = 1 if gs is None else in_f // gs
    scale = torch.rand(out_f, n, generator=gen) * 0.1 + 0.01
    scodes = torch.randint(-127, 128, (out_f, in_f), generator=gen).to(torch.int8)
    got = impl.dequantize(scodes, scale, None, group_size=gs)
    g = in_f // n
    assert got.dtype == torch.float32, f"dequantize must return float32, got {got.dtype}"
    assert_close(got, _deq64(scodes, scale, None, g), atol=1e-6, rtol=1e-6, what="symmetric dequantize differs "
                 "from codes * scale", case=f"int8 codes, group_size={gs}")
    acodes = torch.randint(0, 16, (out_f, in_f), generator=gen).to(torch.uint8)
    zp = torch.randint(3, 13, (out_f, n), generator=gen).to(torch.uint8)
    got = impl.dequantize(acodes, scale, zp, group_size=gs)
    no_zp = type(got) is torch.Tensor and got.shape == acodes.shape and \
        torch.allclose(got.double(), _deq64(acodes, scale, None, g), atol=1e-6, rtol=1e-6)
    assert_close(got, _deq64(acodes, scale, zp, g), atol=1e-6, rtol=1e-6, case=f"uint8 codes, group_size={gs}",
                 what="zero point never subtracted: dequantize returned codes * scale, not (codes - zero_point) * "
                      "scale" if no_zp else "asymmetric dequantize differs from (codes - zero_point) * scale "
                      "(uint8 - uint8 wraps around: convert to float first)")


SQNR_ROWS = 4000
SQNR_CASES = [("int8-sym-row", "symmetric", 8, None, 40.0), ("int4-asym-g128", "asymmetric", 4, 128, 19.0),
              ("int4-sym-g128", "symmetric", 4, 128, 18.0)]


@pytest.mark.part("A")
@pytest.mark.parametrize("name,kind,bits,gs,floor", SQNR_CASES, ids=[c[0] for c in SQNR_CASES])
def test_sqnr_floor_on_gaussian_rows_of_4096(impl, gen, name, kind, bits, gs, floor):
    # the contract's floors are for N(0, 1) rows of 4096 columns; the row count is not the handout's
    # 4096 (a hidden test never reuses a shown input): rows are independent, so the floors are the same
    rows = SQNR_ROWS
    w = torch.randn(rows, 4096, generator=gen)
    if kind == "symmetric":
        codes, scale = impl.quantize_symmetric(w, bits=bits, group_size=gs)
        zp = None
    else:
        codes, scale, zp = impl.quantize_asymmetric(w, bits=bits, group_size=gs)
    g = _gsize(4096, gs)   # float32 arithmetic here: 16M elements, and 1e-7 relative error is plenty for dB
    c = codes.to(torch.float32).view(rows, 4096 // g, g)
    if zp is not None:
        c -= zp.to(torch.float32)[..., None]
    err = (w - (c * scale.to(torch.float32)[..., None]).view(rows, 4096)).norm()
    sqnr = 20 * math.log10(w.norm().item() / err.item())
    if sqnr < floor and zp is not None and \
            _looks_zero_point_not_added(w[:64], codes[:64], scale[:64], zp[:64], g, bits):
        raise AssertionError(f"{ZP_NOT_ADDED} (rows 0..63 of {name}): SQNR {sqnr:.2f} dB, below the floor {floor} dB")
    assert sqnr >= floor, (f"SQNR {sqnr:.2f} dB below the floor {floor} dB for {name} on N(0, 1) {rows}x4096 "
                           "(correct round-to-nearest gives about 41.2 / 20.0 / 18.6 dB)")


def _looks_zero_point_not_added(w, codes, scale, zp, g, bits):
    """Whether asymmetric ``codes`` are clamp(round(w / scale), 0, qmax), the zero point left out,
    away from rounding ties, while the contract's differ (some zero point is not 0)."""
    if not all(type(t) is torch.Tensor for t in (codes, scale, zp)) or tuple(codes.shape) != tuple(w.shape) \
            or zp.shape != scale.shape or not bool((zp != 0).any()):
        return False
    s = scale.to(torch.float64)
    t = w.to(torch.float64) / _per_elem(torch.where(s == 0, torch.ones_like(s), s), g)
    plain = torch.round(t).clamp(0, 2 ** bits - 1)
    return bool(((codes.to(torch.float64) == plain) | _near_tie(t)).all())


# --- Part B: int4 packing ----------------------------------------------------------------------

@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("shape", [(8,), (3, 6), (2, 3, 10)], ids=lambda s: "x".join(map(str, s)))
def test_pack_puts_even_element_in_low_nibble(impl, gen, shape):
    codes = torch.randint(0, 16, shape, generator=gen, dtype=torch.uint8)
    codes[..., 0], codes[..., 1] = 5, 12                  # low 5, high 12: 0xC5, not 0x5C
    packed = impl.pack_int4(codes)
    want = codes[..., 0::2] | (codes[..., 1::2] << 4)
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.uint8, \
        f"pack_int4 must return uint8, got {getattr(packed, 'dtype', type(packed))}"
    assert tuple(packed.shape) == tuple(want.shape), \
        f"pack_int4 of shape {shape} must return {tuple(want.shape)}, got {tuple(packed.shape)}"
    if not torch.equal(packed, want):
        swapped = torch.equal(packed, (codes[..., 0::2] << 4) | codes[..., 1::2])
        raise AssertionError(("nibble order swapped: " if swapped else "wrong packing: ")
                             + f"element 2i goes to the low nibble, 2i+1 to the high nibble; codes "
                             f"{codes.flatten()[:4].tolist()} -> want {[hex(x) for x in want.flatten()[:2].tolist()]}, "
                             f"got {[hex(x) for x in packed.flatten()[:2].tolist()]}")


def _pairs(gen, rows, n):
    """``(rows, 2n)`` int64 codes in [0, 15] whose pairs (2i, 2i+1) are equal: byte i of their packing is
    code * 17 in either nibble order, so the order (graded in the low-nibble test) cannot matter."""
    return torch.randint(0, 16, (rows, n), generator=gen).repeat_interleave(2, -1)


def _check_pairs_packed(packed, codes, case, prop):
    """``packed`` is pack_int4 of ``codes`` (from :func:`_pairs`): uint8, byte i = code 2i * 17."""
    want = (codes[..., 0::2].long() * 17).to(torch.uint8)
    checked(packed, want, what="pack_int4 of codes whose pairs are equal (byte = code | code << 4)", case=case,
            prop=prop)
    assert packed.dtype == torch.uint8, f"pack_int4 must return uint8, got {packed.dtype} ({case})"


@pytest.mark.part("B")
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64],
                         ids=["uint8", "int8", "int32", "int64"])
def test_pack_accepts_every_integer_dtype(impl, gen, dtype):
    codes = _pairs(gen, 3, 7)
    codes[0, :2] = 15                                     # 0xFF: the int8 shift must not overflow
    packed = impl.pack_int4(codes.to(dtype))
    want = (codes[..., 0::2] * 17).to(torch.uint8)        # byte = code | code << 4
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.uint8, \
        f"pack_int4 of {dtype} codes must return uint8, got {getattr(packed, 'dtype', type(packed).__name__)}"
    bad = packed != want
    assert not bad.any(), (f"pack_int4 of {dtype} codes is wrong (convert to uint8 before shifting): "
                           f"{int(bad.sum())} of {want.numel()} bytes differ; got {_shown(packed, bad)}, want "
                           f"{_shown(want, bad)}")


# Each refusal counts next to a right answer: the valid neighbour of the refused codes (integer
# codes, an even length, codes in [0, 15]) is packed and checked first.

@pytest.mark.part("B")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=["fp32", "fp16", "fp64"])
def test_pack_rejects_floating_codes_with_type_error(impl, gen, dtype):
    codes = _pairs(gen, 1, 3)
    case = f"pack_int4 of {dtype} codes of shape {tuple(codes.shape)}"
    _check_pairs_packed(impl.pack_int4(codes), codes, f"{case}: its valid neighbour, the int64 codes",
                        prop="the TypeError for floating codes")
    expect_raises(TypeError, f"{case} (codes must have an integer dtype)", impl.pack_int4, codes.to(dtype))


@pytest.mark.part("B")
@pytest.mark.parametrize("n", [1, 7])
def test_pack_odd_length_raises_value_error(impl, gen, n):
    codes = _pairs(gen, 2, (n + 1) // 2).to(torch.uint8)
    _check_pairs_packed(impl.pack_int4(codes), codes, f"pack_int4 of shape (2, {n + 1}), the valid neighbour",
                        prop="the ValueError for an odd length")
    expect_raises(ValueError, f"pack_int4 of shape (2, {n}) (the last dim must be even)",
                  impl.pack_int4, codes[:, :n].clone())


@pytest.mark.part("B")
@pytest.mark.parametrize("bad,dtype", [(16, torch.uint8), (-1, torch.int8), (200, torch.int32), (-9, torch.int64)],
                         ids=["16-uint8", "-1-int8", "200-int32", "-9-int64"])
def test_pack_out_of_range_code_raises_value_error(impl, gen, bad, dtype):
    codes = _pairs(gen, 2, 4).to(dtype)
    case = f"pack_int4 of {dtype} codes of shape (2, 8)"
    _check_pairs_packed(impl.pack_int4(codes), codes, f"{case} in [0, 15], the valid neighbour",
                        prop=f"the ValueError for a code {bad}")
    at = int(torch.randint(0, codes.numel(), (1,), generator=gen))
    codes.view(-1)[at] = bad
    expect_raises(ValueError, f"{case} holding {bad} at {divmod(at, 8)} (codes are in [0, 15])", impl.pack_int4, codes)


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_unpack_is_exact_inverse_of_pack(impl, gen):
    """Against the contract's format, not the submission's pack_int4 (graded in its own tests)."""
    every_byte = torch.randperm(256, generator=gen).to(torch.uint8).view(4, 64)
    codes = impl.unpack_int4(every_byte)
    assert tuple(codes.shape) == (4, 128), f"unpack_int4 of (4, 64) must return (4, 128), got {tuple(codes.shape)}"
    got = codes.to(torch.int64).reshape(4, 64, 2)
    want = torch.stack((every_byte & 15, every_byte >> 4), -1).long()           # (4, 64, (low, high))
    bad = (got != want).any(-1)
    if bad.any():
        swapped = torch.equal(got, want.flip(-1))
        shown = "; ".join(f"byte {hex(every_byte[r, i].item())} gave {got[r, i].tolist()}, want {want[r, i].tolist()}"
                          for r, i in bad.nonzero()[:3].tolist())
        raise AssertionError(("unpack_int4 reads the nibbles swapped" if swapped else "unpack_int4 is not the inverse "
                              "of pack_int4") + f": byte i must give its low nibble at 2i and its high nibble at "
                              f"2i+1; {int(bad.sum())} of 256 bytes wrong: {shown}")
    c = torch.randint(0, 16, (3, 5, 22), generator=gen, dtype=torch.uint8)
    packed = c[..., 0::2] | (c[..., 1::2] << 4)
    assert torch.equal(impl.unpack_int4(packed).to(torch.uint8), c), \
        "unpack_int4 of a (3, 5, 11) packed tensor does not give back its (3, 5, 22) codes"


# --- Part C: QuantizedLinear -------------------------------------------------------------------

NOT_SUBTRACTED, NOT_ADDED = "zero point not subtracted", "zero point not added"


def _ref_weight(w, bits, gs, bug=None):
    """Grader's float64 dequantized weight of the contract's scheme for QuantizedLinear. ``bug``
    replays a known bits=4 bug: NOT_SUBTRACTED (codes dequantized as codes * scale, the module's)
    or NOT_ADDED (codes clamp(round(w / scale), 0, 15) without + zero_point, quantize_asymmetric's)."""
    out_f, in_f = w.shape
    g = in_f if gs is None else gs
    wg = w.to(torch.float64).reshape(out_f, in_f // g, g)
    if bits == 8:
        scale = wg.abs().amax(-1, keepdim=True) / 127
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)
        return (torch.round(wg / safe).clamp(-127, 127) * scale).reshape(out_f, in_f), wg / safe
    lo, hi = wg.amin(-1, keepdim=True).clamp(max=0), wg.amax(-1, keepdim=True).clamp(min=0)
    scale = (hi - lo) / 15
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    zp = torch.round(-lo / safe).clamp(0, 15)
    codes = (torch.round(wg / safe) + (0 if bug == NOT_ADDED else zp)).clamp(0, 15)
    return ((codes - (0 if bug == NOT_SUBTRACTED else zp)) * scale).reshape(out_f, in_f), wg / safe


def _linear_weight(gen, out_f, in_f, bits, gs, kind):
    """A weight with no element near a rounding tie (so every correct RTN agrees), of a kind:
    normal, nonneg (groups with minimum 0: zero point 0) or with an all-zero row."""
    w = randn((out_f, in_f), gen, scale=0.05)
    if kind == "nonneg":
        w = w.abs()
        w[:, ::16] = 0.0
    if kind == "zero-row":
        w[1] = 0.0
    for _ in range(4):  # moving a group's min or max moves its scale (and zero point): look again
        _, t = _ref_weight(w, bits, gs)
        t = t.reshape(out_f, in_f)
        tie = _near_tie(t, 1e-3) & (w != 0)
        if not tie.any():
            break
        w64, away = w.to(torch.float64), torch.where(t - torch.floor(t) >= 0.5, 1.0, -1.0)
        step = 2e-3 * away * (w64 / torch.where(tie, t, torch.ones_like(t)))
        w = torch.where(tie, w64 + step, w64).to(torch.float32)   # move 0.002 * scale away from the tie
    return w


QL_CASES = [(8, None, "normal", True), (8, 32, "zero-row", False), (4, None, "normal", True),
            (4, 32, "nonneg", True), (4, 64, "zero-row", False)]


def _qlid(c):
    return f"bits{c[0]}-" + ("default" if c[1] is None else f"g{c[1]}") + f"-{c[2]}" + ("-bias" if c[3] else "")


@pytest.mark.part("C")
@pytest.mark.points(3)
@pytest.mark.parametrize("case", QL_CASES, ids=_qlid)
def test_from_linear_forward_equals_x_times_dequantized_weight(impl, gen, case):
    bits, gs, kind, bias = case
    out_f, in_f = 24, 256
    g = 128 if (bits == 4 and gs is None) else gs   # the group QuantizedLinear uses
    weight = _linear_weight(gen, out_f, in_f, bits, g, kind)
    b = randn((out_f,), gen) if bias else None
    q = impl.QuantizedLinear.from_linear(_linear_next_to(impl, weight, b), bits=bits, group_size=gs)
    x = randn((2, 5, in_f), gen)
    with torch.no_grad():
        y = q(x)
    _check_linear_output(y, x, weight, b, bits, g, _qlid(case))


LINEAR_WHAT = ("QuantizedLinear output differs from x @ dequantize(quantize(W)).T + bias "
               "(bits=8: symmetric per row/group; bits=4: asymmetric, group 128 by default)")


def _check_linear_output(y, x, weight, b, bits, g, case):
    """``y = q(x)`` of a QuantizedLinear made from ``weight``/``b`` equals ``x @ W_hat.T + b`` (float64
    oracle); a mismatch that is what a known bug computes is reported under its name."""
    w_hat, _ = _ref_weight(weight, bits, g)
    ref = x.double() @ w_hat.T + (0 if b is None else b.double())
    what = LINEAR_WHAT
    if type(y) is torch.Tensor and y.shape == ref.shape and not torch.allclose(y.double(), ref, atol=2e-5, rtol=1e-4):
        what = _linear_bug(y, x, weight, b, bits, g) or what
    assert_close(y, ref, atol=2e-5, rtol=1e-4, case=case, what=what)


def _linear_bug(y, x, weight, b, bits, g):
    """The bug class when an output ``y`` is what a known QuantizedLinear bug computes, else ''."""
    bias = 0 if b is None else b.double()
    known = []
    if b is not None:
        known += [(None, 2 * bias, "bias added twice: the output is x @ W_hat.T + 2 * bias (F.linear(x, W, bias) "
                                   "already adds it)"),
                  (None, 0, "bias never added: the output is x @ W_hat.T without + bias")]
    if bits == 4:
        known += [(NOT_SUBTRACTED, bias, "zero point never subtracted: the bits=4 forward uses codes * scale, not "
                                         "(codes - zero_point) * scale"),
                  (NOT_ADDED, bias, "zero point never added (by quantize_asymmetric: part A grades its codes): the "
                                    "bits=4 weight dequantizes codes clamp(round(w / scale), 0, 15), the contract's "
                                    "are clamp(round(w / scale) + zero_point, 0, 15)")]
    for bug, added, msg in known:
        want = x.double() @ _ref_weight(weight, bits, g, bug)[0].T + added
        if torch.allclose(y.double(), want, atol=2e-5, rtol=1e-4):
            return msg
    return ""


def _linear_next_to(impl, weight, bias):
    """An ``nn.Linear`` holding ``weight``/``bias``, made where the implementation runs
    (this process, or the sandbox worker: objects cannot travel there by value)."""
    torch_there = getattr(impl, "torch", None)
    assert torch_there is not None, "keep `import torch` in your module (the graders build nn.Linear layers with it)"
    out_f, in_f = weight.shape
    lin = torch_there.nn.Linear(in_f, out_f, bias=bias is not None)
    lin.load_state_dict({"weight": weight, **({"bias": bias} if bias is not None else {})})
    return lin


def _stored_bytes(module):
    """Bytes the module keeps: every distinct storage behind a tensor attribute of the
    module itself (parameters, buffers, plain tensor attributes; whole storages, read
    next to the implementation) plus the state_dict tensors of its submodules (a kept
    ``nn.Linear``, say). Returns (bytes, a short listing of its state_dict)."""
    own = held_storages(module)
    total = sum(int(n) for n in own.values())
    sd = module.state_dict()
    total += sum(t.numel() * t.element_size() for k, t in sd.items() if "." in k)
    found = [f"{k} {str(t.dtype).replace('torch.', '')} {tuple(t.shape)}" for k, t in sd.items()]
    return total, found + [f"{len(own)} storage(s) held by the module itself"]


STORAGE_MARGIN = 2 * MiB  # allocator and interpreter noise in the worker's live memory (measured: under 0.1 MiB)


def _storage_figures(impl, gen, out_f, in_f, bits, gs, g, outside=True):
    """A QuantizedLinear made from an (out_f, in_f) float layer, then called once (its output
    checked). Returns ``[(when, held, listing, growth)]`` right after ``from_linear`` and after
    the call: ``held``/``listing`` as in :func:`_stored_bytes`; ``growth``: the worker's live
    memory (bytes, read from outside it) over its reading before the ``nn.Linear`` was made, with
    that layer's weight and bias dropped once ``from_linear`` returned, so only what the
    submission keeps counts, wherever it keeps it; None in-process or unless ``outside``."""
    # non-negative groups holding a 0 (zero point 0): how codes use the zero point, graded in part A and
    # by the forward test, cannot matter to the storage
    weight, b = _linear_weight(gen, out_f, in_f, bits, g, "nonneg"), randn((out_f,), gen)
    before = resident_bytes(impl) if outside else None
    lin = _linear_next_to(impl, weight, b)
    q = impl.QuantizedLinear.from_linear(lin, bits=bits, group_size=gs)
    held = _stored_bytes(q)  # while the layer is whole: a kept nn.Linear shows in the state_dict
    if before is not None:
        lin.weight, lin.bias = None, None
    figs = [("right after from_linear", *held, None if before is None else resident_bytes(q) - before)]
    x = randn((3, in_f), gen)
    with torch.no_grad():
        y = q(x)
    checked(y, lambda y: _check_linear_output(y, x, weight, b, bits, g, f"bits{bits}-g{g}-out{out_f}-in{in_f}"),
            prop="the weight storage")
    figs.append(("after a forward call", *_stored_bytes(q), None if before is None else resident_bytes(q) - before))
    return figs


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("bits,gs", [(8, None), (8, 64), (4, None), (4, 32)], ids=["bits8-row", "bits8-g64",
                                                                                "bits4-g128", "bits4-g32"])
def test_weight_storage_is_out_in_bits_over_8_plus_scales(impl, gen, bits, gs):
    """What the module keeps, right after from_linear and after a forward call, within
    out*in*bits/8 bytes of codes plus scales (and zero points) and the bias. In-process: the
    storages the module holds, on a 40 x 384 layer. Under the sandbox the same layer runs first
    (it loads the code the large one runs), then a 1000 x 4096 layer is graded on the worker's
    live memory read from outside it (a float32 copy of its weight is 16 MiB, its codes 4 or 2
    MiB) and on the storages it holds (they show an unpacked int4 copy)."""
    def group(in_f):
        return 128 if (bits == 4 and gs is None) else in_f if gs is None else gs
    remote = is_remote(impl)
    if remote:  # the small layer first: its values are checked, and it loads the code the large one runs
        _storage_figures(impl, gen, 40, 384, bits, gs, group(384), outside=False)
    out_f, in_f = (1000, 4096) if remote else (40, 384)
    g = group(in_f)
    n_groups = out_f * (in_f // g)
    codes = out_f * in_f * bits // 8
    allowed = codes + 8 * n_groups + 8 * out_f      # scales (+ zero points) <= 8 B/group; the bias <= 8 B/row
    for when, total, found, growth in _storage_figures(impl, gen, out_f, in_f, bits, gs, g):
        held = f"the tensors the module holds take {total} bytes"
        if growth is None:
            ok, figure = codes <= total <= allowed, held
        else:
            ok, figure = total <= allowed and growth <= allowed + STORAGE_MARGIN, (
                f"the worker's live memory grew by {growth / MiB:.1f} MiB from before the nn.Linear was made (its "
                f"weight dropped after from_linear; read from /proc, outside the process), the bound is "
                f"{allowed / MiB:.1f} MiB plus {STORAGE_MARGIN / MiB:.0f} MiB of allocator noise; {held}")
        assert ok, (
            f"weight storage {when} is out of bounds (bits={bits}, group {g}, out={out_f}, in={in_f}): {figure}; "
            f"the contract allows out*in*bits/8 = {codes} bytes of codes plus scales/zero points ({n_groups} groups) "
            f"and the bias, at most {allowed} bytes. "
            + ("int4 codes must be packed two per byte with pack_int4 (unpacked uint8 codes take twice the space); "
               if bits == 4 else "codes must be int8; ")
            + "do not keep the float weight (not in a SimpleNamespace, a closure or a module-level dict either). "
              "Stored: " + "; ".join(found[:8]))
