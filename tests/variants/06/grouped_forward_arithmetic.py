"""Correct, written another way: quantization multiplies by the reciprocal of the scale
(``w * (qmax / absmax)``, the absmax guarded) instead of dividing by a guarded scale, ranges come from
``torch.aminmax``, int4 packing is arithmetic (``low + 16 * high`` in int16, ``% 16`` and
``// 16`` to unpack) instead of shifts and masks, and ``QuantizedLinear`` keeps its codes as
frozen parameters and never builds the dequantized weight: its forward sums per-group partial
products ``scale_g * (x_g @ (codes_g - zero_point_g).T)``. Every grader test must pass
(item (V) of the common items: the graders grade the contract, not the reference's style).
"""
from __future__ import annotations

import torch
import torch.nn as nn

MAY_FAIL = []


def _grouped(w, group_size, name="w"):
    """``w (out, in)`` float -> float32 ``(out, n, g)`` and g."""
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {getattr(w, 'dtype', type(w).__name__)}")
    if w.dim() != 2:
        raise ValueError(f"{name} must be 2-D (out, in), got shape {tuple(w.shape)}")
    g = w.shape[1] if group_size is None else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or w.shape[1] % g:
        raise ValueError(f"group_size={group_size!r} must be a positive int dividing in={w.shape[1]}")
    return w.float().unflatten(1, (w.shape[1] // g, g)), g


def _bits(bits, lo, hi):
    if isinstance(bits, bool) or not isinstance(bits, int) or not lo <= bits <= hi:
        raise ValueError(f"bits must be an int in [{lo}, {hi}], got {bits!r}")


def quantize_symmetric(w, bits=8, group_size=None):
    _bits(bits, 2, 8)
    wg, _ = _grouped(w, group_size)
    qmax = 2 ** (bits - 1) - 1
    absmax = wg.abs().amax(-1)                                     # (out, n)
    inv = qmax / torch.where(absmax > 0, absmax, torch.ones_like(absmax))  # 1 / scale; a zero group: any finite
    codes = (wg * inv.unsqueeze(-1)).round().clamp(-qmax, qmax)
    return codes.flatten(1).to(torch.int8), absmax / qmax


def quantize_asymmetric(w, bits=4, group_size=128):
    _bits(bits, 1, 8)
    wg, _ = _grouped(w, group_size)
    qmax = 2 ** bits - 1
    lo, hi = torch.aminmax(wg, dim=-1)
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)                      # 0 is always in the range
    span = hi - lo
    inv = qmax / torch.where(span > 0, span, torch.ones_like(span))
    zero_point = (-lo * inv).round().clamp(0, qmax)
    codes = ((wg * inv.unsqueeze(-1)).round() + zero_point.unsqueeze(-1)).clamp(0, qmax)
    return codes.flatten(1).to(torch.uint8), span / qmax, zero_point.to(torch.uint8)


def dequantize(codes, scale, zero_point=None, group_size=None):
    if codes.dim() != 2 or scale.dim() != 2 or scale.shape[0] != codes.shape[0]:
        raise ValueError(f"codes {tuple(codes.shape)} and scale {tuple(scale.shape)} do not match")
    n = scale.shape[1]
    g = codes.shape[1] // n if group_size is None else group_size
    if n * g != codes.shape[1]:
        raise ValueError(f"scale {tuple(scale.shape)} and group_size={group_size} do not cover in={codes.shape[1]}")
    c = codes.float().unflatten(1, (n, g))
    if zero_point is not None:
        if zero_point.shape != scale.shape:
            raise ValueError(f"zero_point {tuple(zero_point.shape)} must be shaped like scale {tuple(scale.shape)}")
        c = c - zero_point.float().unsqueeze(-1)
    return (c * scale.float().unsqueeze(-1)).flatten(1)


def pack_int4(codes):
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex() \
            or codes.dtype == torch.bool:
        raise TypeError(f"codes must have an integer dtype, got {getattr(codes, 'dtype', type(codes).__name__)}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"the last dim of codes must be even, got shape {tuple(codes.shape)}")
    if ((codes < 0) | (codes > 15)).any():
        raise ValueError("codes must be in [0, 15]")
    pairs = codes.to(torch.int16).unflatten(-1, (codes.shape[-1] // 2, 2))
    return (pairs[..., 0] + 16 * pairs[..., 1]).to(torch.uint8)


def unpack_int4(packed):
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {getattr(packed, 'dtype', type(packed).__name__)}")
    return torch.stack((packed % 16, packed // 16), dim=-1).flatten(-2)


class QuantizedLinear(nn.Module):
    """Codes, scales and zero points as frozen parameters; the forward works group by group."""

    def __init__(self, in_features, out_features, bits=8, group_size=None, bias=True):
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits!r}")
        g = (128 if bits == 4 else in_features) if group_size is None else group_size
        if in_features % g or in_features % 2 and bits == 4:
            raise ValueError(f"group size {g} must divide in_features={in_features}")
        self.in_features, self.out_features, self.bits, self.g = in_features, out_features, bits, g
        n = in_features // g
        frozen = lambda *shape, dtype: nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)
        self.codes = frozen(out_features, in_features // (8 // bits) if bits == 4 else in_features,
                            dtype=torch.uint8 if bits == 4 else torch.int8)
        self.scale = frozen(out_features, n, dtype=torch.float32)
        self.zero_point = frozen(out_features, n, dtype=torch.uint8) if bits == 4 else None
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @classmethod
    def from_linear(cls, linear, bits=8, group_size=None):
        q = cls(linear.in_features, linear.out_features, bits, group_size, bias=linear.bias is not None)
        w = linear.weight.detach()
        with torch.no_grad():
            if bits == 8:
                codes, scale = quantize_symmetric(w, 8, q.g)
                q.codes.copy_(codes)
            else:
                codes, scale, zp = quantize_asymmetric(w, 4, q.g)
                q.codes.copy_(pack_int4(codes))
                q.zero_point.copy_(zp)
            q.scale.copy_(scale)
            if q.bias is not None:
                q.bias.copy_(linear.bias.detach())
        return q

    def forward(self, x):
        codes = self.codes if self.bits == 8 else unpack_int4(self.codes)
        c = codes.float().unflatten(1, (-1, self.g))                       # (out, n, g)
        if self.zero_point is not None:
            c = c - self.zero_point.float().unsqueeze(-1)
        xg = x.float().unflatten(-1, (-1, self.g))                         # (..., n, g)
        partial = torch.einsum("...ng,ong->...on", xg, c)                  # (..., out, n)
        y = (partial * self.scale).sum(-1)                                 # (..., out)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)
