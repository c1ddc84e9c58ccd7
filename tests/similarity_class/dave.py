"""GQA, lab 03 (dave): batch and KV head folded into one bmm dimension."""
import math

import torch
import torch.nn as nn


def _need(ok, exc, msg):
    if not ok:
        raise exc(msg)


def _causal_bias(lq, lk, device, dtype):
    shift = lk - lq
    rows = torch.arange(lq, device=device).view(-1, 1)
    cols = torch.arange(lk, device=device).view(1, -1)
    return torch.zeros(lq, lk, device=device, dtype=dtype).masked_fill(cols - rows > shift, float("-inf"))


def grouped_query_attention(q, k, v, is_causal=False, scale=None):
    for nm, x in zip("qkv", (q, k, v)):
        _need(isinstance(x, torch.Tensor), TypeError, f"{nm}: expected a tensor, got {type(x).__name__}")
        _need(x.is_floating_point(), TypeError, f"{nm}: dtype {x.dtype} is not floating")
        _need(x.dim() == 4, ValueError, f"{nm}: shape {tuple(x.shape)} is not 4-D")
    _need(q.dtype == k.dtype == v.dtype, TypeError, f"q/k/v dtypes {q.dtype}, {k.dtype}, {v.dtype} differ")
    b, nq, m, d = q.shape
    _, nk, n, _ = k.shape
    _need(v.shape == k.shape, ValueError, f"v {tuple(v.shape)} != k {tuple(k.shape)}")
    _need(k.shape[0] == b and k.shape[3] == d, ValueError, f"k {tuple(k.shape)} vs q {tuple(q.shape)}")
    _need(nk >= 1 and nq % nk == 0, ValueError, f"Hq={nq}, Hkv={nk}: Hq % Hkv != 0")
    _need(n >= 1, ValueError, f"Lk={n} < 1")
    rep = nq // nk
    ct = torch.float64 if q.dtype is torch.float64 else torch.float32
    sc = (1.0 / math.sqrt(d)) if scale is None else float(scale)
    q3 = q.to(ct).reshape(b * nk, rep * m, d)
    k3 = k.to(ct).reshape(b * nk, n, d)
    v3 = v.to(ct).reshape(b * nk, n, d)
    logit = torch.bmm(q3, k3.transpose(1, 2)) * sc
    if is_causal:
        logit = (logit.view(b * nk, rep, m, n) + _causal_bias(m, n, q.device, ct)).view(b * nk, rep * m, n)
    mx = logit.amax(dim=2, keepdim=True).detach()  # a constant shift: no gradient needed
    mx = mx.masked_fill(torch.isinf(mx), 0)
    w = torch.exp(logit - mx)
    den = w.sum(dim=2, keepdim=True)
    den = den + (den == 0).to(den.dtype)
    return torch.bmm(w / den, v3).view(b, nq, m, d).to(q.dtype)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        _need(n_heads >= 1 and n_kv_heads >= 1, ValueError, f"heads {n_heads}/{n_kv_heads} must be >= 1")
        _need(n_heads % n_kv_heads == 0, ValueError, f"{n_heads} % {n_kv_heads} != 0")
        _need(d_model % n_heads == 0, ValueError, f"d_model {d_model} % n_heads {n_heads} != 0")
        self.cfg = (n_heads, n_kv_heads, d_model // n_heads)
        width = d_model // n_heads
        self.q_proj = nn.Linear(d_model, width * n_heads, bias=bias)
        self.k_proj = nn.Linear(d_model, width * n_kv_heads, bias=bias)
        self.v_proj = nn.Linear(d_model, width * n_kv_heads, bias=bias)
        self.o_proj = nn.Linear(width * n_heads, d_model, bias=bias)

    def forward(self, x, is_causal=False):
        nh, nkv, w = self.cfg
        bsz, seq = x.shape[:2]
        qs = self.q_proj(x).unflatten(-1, (nh, w)).transpose(1, 2)
        ks = self.k_proj(x).unflatten(-1, (nkv, w)).transpose(1, 2)
        vs = self.v_proj(x).unflatten(-1, (nkv, w)).transpose(1, 2)
        ctx = grouped_query_attention(qs, ks, vs, is_causal)
        return self.o_proj(ctx.transpose(1, 2).flatten(2))
