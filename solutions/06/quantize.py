"""Weight quantization: the reference solution of lab 06.

Round-to-nearest (RTN) quantization of a linear layer's weight ``w: (out, in)``
to 8 or 4 bits, per output row or per group of ``group_size`` columns, the
scheme of LLM.int8()'s vector-wise baseline (Dettmers et al., 2022) and of
group-wise int4 in GPTQ/AWQ-style inference kernels (without their error
correction), plus int4 packing (two codes per byte) and a drop-in
``QuantizedLinear``.

symmetric:  scale = absmax / (2**(bits-1) - 1), code = round(w / scale)
asymmetric: range [min(w, 0), max(w, 0)], scale = (hi - lo) / (2**bits - 1),
            zero_point = round(-lo / scale), code = round(w / scale) + zero_point
dequantize: (code - zero_point) * scale

Part A: quantize_symmetric, quantize_asymmetric, dequantize
Part B: pack_int4, unpack_int4          Part C: QuantizedLinear
"""
from __future__ import annotations

import torch
import torch.nn as nn


def _groups(w: torch.Tensor, group_size: int | None, name: str = "w") -> tuple[torch.Tensor, int]:
    """View ``w: (out, in)`` as float32 ``(out, in // g, g)``; returns it and g.
    Raises TypeError (not a floating tensor) or ValueError (not 2-D, bad group_size)."""
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"{name} must be a floating torch.Tensor, got "
                        f"{w.dtype if isinstance(w, torch.Tensor) else type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"{name} must be 2-D (out, in), got shape {tuple(w.shape)}")
    out_f, in_f = w.shape
    g = in_f if group_size is None else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ValueError(f"group_size must be None or a positive int, got {group_size!r}")
    if in_f % g != 0:
        raise ValueError(f"group_size={g} does not divide in={in_f}")
    return w.float().reshape(out_f, in_f // g, g), g


def _check_bits(bits: int, allowed: range) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in allowed:
        raise ValueError(f"bits must be an int in [{allowed.start}, {allowed.stop - 1}], got {bits!r}")


# --- Part A: symmetric and asymmetric quantization ---

def quantize_symmetric(w: torch.Tensor, bits: int = 8, group_size: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest quantization.

    w: (out, in) float. Returns codes (out, in) int8 in [-qmax, qmax] with
    qmax = 2**(bits-1) - 1, and scale (out, in // g) float32 = absmax / qmax per
    row (group_size=None, g = in) or per group of g contiguous columns.
    An all-zero group gets scale 0 and codes 0 (the division uses a guarded scale).
    Raises ValueError (bits not in 2..8, w not 2-D, g does not divide in), TypeError (w not float).
    """
    _check_bits(bits, range(2, 9))
    wg, g = _groups(w, group_size)                                  # (out, n, g)
    qmax = 2 ** (bits - 1) - 1
    scale = wg.abs().amax(dim=-1) / qmax                            # (out, n)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)   # zero-absmax guard
    codes = torch.round(wg / safe[..., None]).clamp(-qmax, qmax)
    return codes.to(torch.int8).reshape(w.shape), scale


def quantize_asymmetric(w: torch.Tensor, bits: int = 4, group_size: int | None = 128
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric (min/max) round-to-nearest quantization with a zero point.

    w: (out, in) float. The range [min(w, 0), max(w, 0)] always contains 0, so
    0 is exactly representable (code == zero_point). Returns codes (out, in)
    uint8 in [0, 2**bits - 1], scale (out, in // g) float32 = (hi - lo) / (2**bits - 1)
    and zero_point (out, in // g) uint8 = round(-lo / scale) in the code range.
    A constant-zero group gets scale 0, zero_point 0, codes 0.
    Raises ValueError (bits not in 1..8, w not 2-D, g does not divide in), TypeError (w not float).
    """
    _check_bits(bits, range(1, 9))
    wg, g = _groups(w, group_size)                                  # (out, n, g)
    qmax = 2 ** bits - 1
    lo = wg.amin(dim=-1).clamp(max=0)                               # (out, n)
    hi = wg.amax(dim=-1).clamp(min=0)
    scale = (hi - lo) / qmax
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)   # zero-range guard
    zero_point = torch.round(-lo / safe).clamp(0, qmax)
    codes = (torch.round(wg / safe[..., None]) + zero_point[..., None]).clamp(0, qmax)
    return codes.to(torch.uint8).reshape(w.shape), scale, zero_point.to(torch.uint8)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None,
               group_size: int | None = None) -> torch.Tensor:
    """(codes - zero_point) * scale per group, float32 (out, in).

    codes: (out, in) integer; scale: (out, n) float; zero_point: None (symmetric)
    or (out, n) integer. group_size=None infers g = in // n (n = 1: per row).
    Raises ValueError when the shapes do not agree.
    """
    if codes.dim() != 2 or scale.dim() != 2 or scale.shape[0] != codes.shape[0]:
        raise ValueError(f"codes (out, in) and scale (out, n) do not match: "
                         f"codes {tuple(codes.shape)}, scale {tuple(scale.shape)}")
    out_f, in_f = codes.shape
    n = scale.shape[1]
    g = in_f // n if group_size is None else group_size
    if n * g != in_f:
        raise ValueError(f"scale {tuple(scale.shape)} and group_size={group_size} do not cover in={in_f}")
    c = codes.to(torch.float32).reshape(out_f, n, g)
    if zero_point is not None:
        if zero_point.shape != scale.shape:
            raise ValueError(f"zero_point shape {tuple(zero_point.shape)} must equal scale shape {tuple(scale.shape)}")
        c = c - zero_point.to(torch.float32)[..., None]
    return (c * scale.to(torch.float32)[..., None]).reshape(out_f, in_f)


# --- Part B: int4 packing ---

def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes in [0, 15] two per byte along the last dim.

    codes: (..., 2n) any integer dtype. Element 2i goes to the low nibble and
    2i+1 to the high nibble of byte i: [1, 2, 3, 4] -> [0x21, 0x43].
    Returns (..., n) uint8. Raises TypeError (not an integer dtype) or
    ValueError (odd last dim, a code outside [0, 15]).
    """
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex() \
            or codes.dtype == torch.bool:
        raise TypeError(f"codes must be an integer tensor, got "
                        f"{codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__}")
    if codes.dim() == 0 or codes.shape[-1] % 2 != 0:
        raise ValueError(f"the last dim of codes must be even, got shape {tuple(codes.shape)}")
    if codes.numel() and (codes.min() < 0 or codes.max() > 15):
        raise ValueError(f"codes must be in [0, 15], got min {codes.min().item()}, max {codes.max().item()}")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4: (..., n) uint8 -> (..., 2n) uint8 codes in [0, 15].
    Raises TypeError when packed is not uint8."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got "
                        f"{packed.dtype if isinstance(packed, torch.Tensor) else type(packed).__name__}")
    low, high = packed & 0xF, packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)             # (..., n, 2) -> (..., 2n)


# --- Part C: QuantizedLinear ---

class QuantizedLinear(nn.Module):
    """A Linear layer whose weight is stored quantized and dequantized on the fly.

    bits=8: int8 symmetric codes (out, in), scale (out, n).
    bits=4: pack_int4'd asymmetric codes (out, in // 2) uint8, scale and
    zero_point (out, n); group_size=None means 128.
    Weight storage: out * in * bits / 8 bytes plus scales (and zero points).
    Build one with ``QuantizedLinear.from_linear(linear, bits, group_size)``.
    """

    def __init__(self, in_features: int, out_features: int, bits: int = 8,
                 group_size: int | None = None, bias: bool = True):
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits!r}")
        if bits == 4 and group_size is None:
            group_size = 128
        g = in_features if group_size is None else group_size
        if in_features % g != 0 or (bits == 4 and in_features % 2 != 0):
            raise ValueError(f"group_size={group_size} (and, for bits=4, 2) must divide in_features={in_features}")
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size = bits, group_size
        n = in_features // g
        if bits == 8:
            self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
            self.zero_point = None
        else:
            self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
            self.register_buffer("zero_point", torch.zeros(out_features, n, dtype=torch.uint8))
        self.register_buffer("scale", torch.zeros(out_features, n, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 8, group_size: int | None = None) -> "QuantizedLinear":
        """Quantize ``linear.weight`` (bits=8: quantize_symmetric; bits=4:
        quantize_asymmetric + pack_int4) and copy its bias."""
        q = cls(linear.in_features, linear.out_features, bits, group_size, bias=linear.bias is not None)
        w = linear.weight.detach()
        if bits == 8:
            codes, scale = quantize_symmetric(w, bits=8, group_size=q.group_size)
            q.qweight.copy_(codes)
        else:
            codes, scale, zp = quantize_asymmetric(w, bits=4, group_size=q.group_size)
            q.qweight.copy_(pack_int4(codes))
            q.zero_point.copy_(zp)
        q.scale.copy_(scale)
        if linear.bias is not None:
            q.bias.data.copy_(linear.bias.detach().float())
        return q

    def weight(self) -> torch.Tensor:
        """The dequantized weight, (out, in) float32."""
        codes = self.qweight if self.bits == 8 else unpack_int4(self.qweight)
        return dequantize(codes, self.scale, self.zero_point, group_size=self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in) -> (..., out) = x @ W_hat.T + bias, in x's dtype."""
        y = x @ self.weight().to(x.dtype).T
        return y if self.bias is None else y + self.bias.to(x.dtype)
