"""Reference computations (oracles) that graders compare against, in float64.

Shared by labs 03, 04 and 05 (attention) and 07 and 09 (the trusted training model);
graders never copy them.
"""
from __future__ import annotations

import math

import torch


def causal_mask(Lq: int, Lk: int, device="cpu") -> torch.Tensor:
    """Bottom-right aligned causal mask ``(Lq, Lk)`` bool, True where allowed:
    query ``i`` may attend key ``j`` iff ``j <= i + (Lk - Lq)`` (FlashAttention >= 2.1)."""
    i = torch.arange(Lq, device=device)[:, None]
    j = torch.arange(Lk, device=device)[None, :]
    return j <= i + (Lk - Lq)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive attention in float64 on the inputs' device.

    ``q: (B, H, Lq, D)``, ``k, v: (B, Hkv, Lk, D)`` with ``H % Hkv == 0`` (query head ``h``
    uses KV head ``h // (H // Hkv)``). Returns ``(out (B, H, Lq, D) float64,
    lse (B, H, Lq) float64)``, natural-log log-sum-exp of the scaled logits;
    rows with no allowed key give zeros and ``-inf``. Differentiable.
    """
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    H, Hkv = q.shape[1], k.shape[1]
    if H != Hkv:
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    # shift by the (detached) row max; an empty row shifts by 0 so exp(-inf - 0) = 0, never NaN
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    out = (p @ v) / torch.where(l == 0, torch.ones_like(l), l)
    return out, (m + torch.log(l)).squeeze(-1)


def train_net(params: dict, spec: dict, x: torch.Tensor, skip=()) -> torch.Tensor:
    """``TrainNet(spec)`` (``harness.sandbox.probes.training``) in float64, functionally: ``params``
    maps ``layers.<name>.weight`` / ``.bias`` / ``scale`` to tensors (autograd leaves to
    differentiate); the layers named in ``skip`` are left out; tanh between layers; a spec
    with no layers is ``tanh`` (a stage without parameters). Input ``(..., in)``, output
    ``(..., out)`` float64."""
    h = x.double()
    if not spec["layers"]:
        return torch.tanh(h)
    names = [L["name"] for L in spec["layers"] if L["name"] not in skip]
    for i, n in enumerate(names):
        b = params.get(f"layers.{n}.bias")
        h = h @ params[f"layers.{n}.weight"].double().T + (b.double() if b is not None else 0)
        if i < len(names) - 1:
            h = torch.tanh(h)
    return h * params["scale"].double()
