"""Correct, written another way: GPTQ's storage layout and einops. ``QuantizedLinear`` keeps
its packed codes, scales and zero points transposed, input-major (``qweight (in // 2, out)``,
``scales (in // g, out)``, as GPTQ/AutoGPTQ checkpoints store them), in plain tensor attributes
registered nowhere, and dequantizes through ``einops.repeat``; the quantizers group with
``einops.rearrange``, pack with ``torch.bitwise_*`` and unpack by interleaving through a
``(..., n, 2)`` view. Every grader test must pass (item (V) of the common items).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from einops import rearrange, repeat

MAY_FAIL = []


def _groups(w, group_size):
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"w must be a floating tensor, got {getattr(w, 'dtype', type(w).__name__)}")
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D, got shape {tuple(w.shape)}")
    g = w.shape[1] if group_size is None else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or w.shape[1] % g:
        raise ValueError(f"group_size={group_size!r} does not divide in={w.shape[1]}")
    return rearrange(w.float(), "o (n g) -> o n g", g=g)


def _check_bits(bits, lo, hi):
    if isinstance(bits, bool) or not isinstance(bits, int) or not lo <= bits <= hi:
        raise ValueError(f"bits must be an int in [{lo}, {hi}], got {bits!r}")


def quantize_symmetric(w, bits=8, group_size=None):
    _check_bits(bits, 2, 8)
    wg = _groups(w, group_size)
    qmax = 2 ** (bits - 1) - 1
    scale = wg.abs().amax(-1) / qmax
    guarded = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.clamp(torch.round(wg / guarded[..., None]), -qmax, qmax)
    return rearrange(codes, "o n g -> o (n g)").to(torch.int8), scale


def quantize_asymmetric(w, bits=4, group_size=128):
    _check_bits(bits, 1, 8)
    wg = _groups(w, group_size)
    qmax = 2 ** bits - 1
    lo = torch.minimum(wg.amin(-1), torch.zeros(()))
    hi = torch.maximum(wg.amax(-1), torch.zeros(()))
    scale = (hi - lo) / qmax
    guarded = torch.where(scale > 0, scale, torch.ones_like(scale))
    zp = torch.clamp(torch.round(-lo / guarded), 0, qmax)
    codes = torch.clamp(torch.round(wg / guarded[..., None]) + zp[..., None], 0, qmax)
    return rearrange(codes, "o n g -> o (n g)").to(torch.uint8), scale, zp.to(torch.uint8)


def dequantize(codes, scale, zero_point=None, group_size=None):
    if codes.dim() != 2 or scale.dim() != 2 or scale.shape[0] != codes.shape[0]:
        raise ValueError(f"codes {tuple(codes.shape)} and scale {tuple(scale.shape)} do not match")
    n = scale.shape[1]
    g = codes.shape[1] // n if group_size is None else group_size
    if n * g != codes.shape[1]:
        raise ValueError(f"scale {tuple(scale.shape)} and group_size={group_size} do not cover in={codes.shape[1]}")
    c = codes.to(torch.float32)
    if zero_point is not None:
        if zero_point.shape != scale.shape:
            raise ValueError(f"zero_point {tuple(zero_point.shape)} must be shaped like scale {tuple(scale.shape)}")
        c = c - repeat(zero_point.to(torch.float32), "o n -> o (n g)", g=g)
    return c * repeat(scale.to(torch.float32), "o n -> o (n g)", g=g)


def pack_int4(codes):
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex() \
            or codes.dtype == torch.bool:
        raise TypeError(f"codes must have an integer dtype, got {getattr(codes, 'dtype', type(codes).__name__)}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"the last dim of codes must be even, got shape {tuple(codes.shape)}")
    if codes.numel() and not bool(((codes >= 0) & (codes <= 15)).all()):
        raise ValueError("codes must be in [0, 15]")
    pairs = rearrange(codes.to(torch.uint8), "... (n two) -> ... n two", two=2)
    return torch.bitwise_or(pairs[..., 0], torch.bitwise_left_shift(pairs[..., 1], 4))


def unpack_int4(packed):
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {getattr(packed, 'dtype', type(packed).__name__)}")
    out = torch.empty(*packed.shape, 2, dtype=torch.uint8, device=packed.device)
    out[..., 0] = torch.bitwise_and(packed, 15)
    out[..., 1] = torch.bitwise_right_shift(packed, 4)
    return out.view(*packed.shape[:-1], 2 * packed.shape[-1])


class QuantizedLinear(nn.Module):
    """Input-major storage (GPTQ's): qweight (in or in // 2, out), scales/zeros (in // g, out)."""

    def __init__(self, in_features, out_features, bits=8, group_size=None, bias=True):
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits!r}")
        self.group_size = (128 if bits == 4 else in_features) if group_size is None else group_size
        if in_features % self.group_size or (bits == 4 and in_features % 2):
            raise ValueError(f"group size {self.group_size} must divide in_features={in_features}")
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        n = in_features // self.group_size
        rows = in_features // 2 if bits == 4 else in_features
        self.qweight = torch.zeros(rows, out_features, dtype=torch.uint8 if bits == 4 else torch.int8)
        self.scales = torch.zeros(n, out_features)
        self.zeros = torch.zeros(n, out_features, dtype=torch.uint8) if bits == 4 else None
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @classmethod
    def from_linear(cls, linear, bits=8, group_size=None):
        q = cls(linear.in_features, linear.out_features, bits, group_size, bias=linear.bias is not None)
        w = linear.weight.detach()
        if bits == 8:
            codes, scale = quantize_symmetric(w, 8, q.group_size)
        else:
            codes, scale, zp = quantize_asymmetric(w, 4, q.group_size)
            codes = pack_int4(codes)
            q.zeros = zp.t().contiguous()
        q.qweight, q.scales = codes.t().contiguous(), scale.t().contiguous()
        if q.bias is not None:
            q.bias.data.copy_(linear.bias.detach())
        return q

    def forward(self, x):
        codes = self.qweight.t()                                         # (out, in) or (out, in // 2)
        if self.bits == 4:
            codes = unpack_int4(codes.contiguous())
        zp = None if self.zeros is None else self.zeros.t()
        w_hat = dequantize(codes, self.scales.t(), zp, group_size=self.group_size)
        y = x @ w_hat.to(x.dtype).t()
        return y if self.bias is None else y + self.bias.to(x.dtype)
