"""Lab 06: weight quantization (int8 and int4, round to nearest).

You build the quantizer behind weight-only int8/int4 inference: symmetric and
asymmetric (zero-point) round-to-nearest quantization per output row or per
group of columns, int4 packing (two codes per byte), and a QuantizedLinear
that stores the packed codes and dequantizes on the fly. Sources: LLM.int8()
(Dettmers et al., 2022) for vector-wise absmax int8; group-wise int4 as used by
GPTQ/AWQ kernels (here without their error correction: plain RTN).

Parts (see README.md):
  A  quantize_symmetric, quantize_asymmetric, dequantize   pytest labs/06 -k quantize
  B  pack_int4, unpack_int4                                pytest labs/06 -k pack
  C  QuantizedLinear.from_linear / forward                 pytest labs/06 -k linear
Run everything with `pytest labs/06`; self-grade with `labs grade . --lab 06`.
"""
from __future__ import annotations

import torch
import torch.nn as nn


# --- Part A: symmetric and asymmetric quantization ---

def quantize_symmetric(w: torch.Tensor, bits: int = 8, group_size: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest quantization.

    w: (out, in) float. group_size=None: one scale per row (g = in); else each row
    is split into in // g contiguous groups of g columns (in % g != 0 -> ValueError).
    qmax = 2**(bits-1) - 1 (127 for 8 bits, 7 for 4 bits).
    Returns codes (out, in) int8 = round(w / scale) in [-qmax, qmax] (round to
    nearest, not truncation) and scale (out, in // g) float32 = absmax / qmax.
    Stable form: an all-zero group has absmax 0; divide by a guarded scale
    (1 where scale == 0) so no NaN/Inf appears at any step; its scale stays 0
    and its codes 0. Error bound: |w - codes * scale| <= scale / 2.
    Raises ValueError (bad bits, w not 2-D, group_size), TypeError (w not floating).
    """
    raise NotImplementedError("Part A: per row/group absmax scale, guarded divide, round, clamp, int8")


def quantize_asymmetric(w: torch.Tensor, bits: int = 4, group_size: int | None = 128
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric (min/max) round-to-nearest quantization with a zero point.

    w: (out, in) float; groups as in quantize_symmetric (None = per row).
    Range [lo, hi] = [min(w, 0), max(w, 0)] per group, so 0 is always exact.
    qmax = 2**bits - 1; scale = (hi - lo) / qmax (float32, (out, in // g));
    zero_point = round(-lo / scale) clamped to [0, qmax], uint8, same shape as scale;
    codes = clamp(round(w / scale) + zero_point, 0, qmax), uint8 (out, in).
    A constant-zero group: scale 0, zero_point 0, codes 0 (guard the divisions).
    Returns (codes, scale, zero_point).
    Raises ValueError (bad bits, w not 2-D, group_size), TypeError (w not floating).
    """
    raise NotImplementedError("Part A: per group min/max range including 0, scale, zero point, round, clamp")


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None,
               group_size: int | None = None) -> torch.Tensor:
    """(codes - zero_point) * scale per group, returned as float32 (out, in).

    codes: (out, in) integer; scale: (out, n) float; zero_point: None (symmetric)
    or (out, n) integer. group_size=None: g = in // n (n = 1 means per row).
    Compute in float32 (uint8 - uint8 wraps around!).
    Raises ValueError when the shapes do not agree.
    """
    raise NotImplementedError("Part A: convert to float32, subtract the zero point, multiply by the scale per group")


# --- Part B: int4 packing ---

def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes two per byte along the last dim.

    codes: (..., 2n) of any integer dtype (uint8, int8, int32, int64) with values
    in [0, 15]. Element 2i goes to the low nibble, 2i+1 to the high nibble:
    [1, 2, 3, 4] -> [0x21, 0x43]. Returns (..., n) uint8.
    Raises TypeError for a floating (non-integer) dtype; ValueError for an odd
    last dim or a code outside [0, 15].
    """
    raise NotImplementedError("Part B: check dtype, length and range, then low | (high << 4) as uint8")


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Exact inverse of pack_int4: (..., n) uint8 -> (..., 2n) uint8 codes."""
    raise NotImplementedError("Part B: split each byte into (low nibble, high nibble) and interleave them")


# --- Part C: QuantizedLinear ---

class QuantizedLinear(nn.Module):
    """A Linear layer whose weight is stored quantized and dequantized on the fly.

    bits=8: int8 symmetric codes (out, in) and scale (out, n) (group_size None = per row).
    bits=4: asymmetric codes packed with pack_int4, (out, in // 2) uint8, plus scale
    and zero_point (out, n); group_size None means 128.
    Store them with register_buffer (so they are in state_dict and move with .to());
    keep the bias as a float tensor. Do not keep the float weight.
    Weight storage: out * in * bits / 8 bytes plus scales (and zero points).
    Build one with QuantizedLinear.from_linear(linear, bits, group_size).
    """

    def __init__(self, in_features: int, out_features: int, bits: int = 8,
                 group_size: int | None = None, bias: bool = True):
        super().__init__()
        raise NotImplementedError("Part C: register empty buffers for the codes, scale (and zero point), and the bias")

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 8, group_size: int | None = None) -> "QuantizedLinear":
        """Quantize linear.weight (bits=8: quantize_symmetric; bits=4: quantize_asymmetric
        then pack_int4) and copy linear.bias. Returns a QuantizedLinear."""
        raise NotImplementedError("Part C: quantize linear.weight, pack it for bits=4, fill the buffers, copy the bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in) -> (..., out) = x @ dequantize(...).T + bias."""
        raise NotImplementedError("Part C: unpack (bits=4), dequantize, then x @ W_hat.T + bias")
