"""Lab 14: speculative decoding and knowledge distillation (reference).

What you build
  Part A  ``logits_to_probs`` (temperature, top-k, top-p) and ``speculative_sample``: one
          verification step of speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen
          et al. 2023, Algorithm 2), lossless: what it emits is distributed as the target's.
  Part B  ``SpecStats`` and ``speculative_generate``: the draft-then-verify loop over two models
          with KV caches rolled back to the accepted length.
  Part C  ``forward_kl``, ``reverse_kl``, ``generalized_jsd`` (GKD) and ``distillation_loss``
          (Hinton et al. 2015): token-level distillation losses with padding masks.

Test as you go:  ``pytest labs/14`` (visible tests), ``-k probs or sample`` (Part A),
``-k generate`` (Part B), ``-k "kl or jsd or distill"`` (Part C),
``labs grade . --lab 14`` (self-grade with the hidden graders, where installed).

Given (finished; the graders use them as they are): ``ModelConfig``, ``KVCache``,
``TinyDecoder`` and ``make_model``. Notation: p is always the TARGET's distribution, q the
DRAFT's; B rows, gamma proposals per block, V the vocabulary, L the prompt length.
"""
from __future__ import annotations

import bisect
import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- The models (given) -------------------------------------------------------------------------

@dataclass
class ModelConfig:
    """Hyper-parameters of ``TinyDecoder``. ``head_dim = d_model // n_heads``."""

    vocab_size: int = 64       # V
    d_model: int = 32          # residual width
    n_layers: int = 2
    n_heads: int = 4
    ffn_hidden: int = 64       # SwiGLU hidden width
    max_seq_len: int = 128     # positions 0 .. max_seq_len-1
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_hidden", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig: {name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"ModelConfig: d_model={self.d_model} must split into n_heads={self.n_heads} heads "
                             f"of even size")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class KVCache:
    """A preallocated K/V cache of ``max_seq_len`` positions for ``batch_size`` sequences:
    ``k[layer]``, ``v[layer]`` of shape ``(batch_size, n_heads, max_seq_len, head_dim)``; the first
    ``seq_len`` positions are valid. ``crop(n)`` keeps the first ``n`` (rollback after a rejection)."""

    def __init__(self, config: ModelConfig, batch_size: int = 1, max_seq_len: int | None = None,
                 dtype=torch.float32, device="cpu"):
        self.max_seq_len = config.max_seq_len if max_seq_len is None else int(max_seq_len)
        if not 1 <= self.max_seq_len <= config.max_seq_len:
            raise ValueError(f"max_seq_len must be in [1, {config.max_seq_len}], got {max_seq_len}")
        shape = (batch_size, config.n_heads, self.max_seq_len, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.seq_len = 0

    def crop(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self.seq_len:
            raise ValueError(f"crop(n): n must be an int in [0, seq_len={self.seq_len}], got {n!r}")
        self.seq_len = n


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of ``x (B, H, T, D)`` at positions ``pos (T,)``."""
    D = x.shape[-1]
    inv = theta ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    ang = pos.to(torch.float64)[:, None] * inv                                    # (T, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class TinyDecoder(nn.Module):
    """A Llama-style decoder (RMSNorm, RoPE, multi-head attention, SwiGLU, untied head), float32,
    frozen. ``forward(input_ids (B, T), cache=None) -> logits (B, T, V)``: with a cache, the T tokens
    follow its ``seq_len`` stored positions and are appended (``seq_len += T``)."""

    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        self.config = cfg = config if config is not None else ModelConfig()
        d, f = cfg.d_model, cfg.ffn_hidden
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        self.layers = nn.ModuleList()
        for _ in range(cfg.n_layers):
            layer = nn.Module()
            layer.attn_norm, layer.mlp_norm = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
            layer.wqkv, layer.wo = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            layer.w1, layer.w3, layer.w2 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False), \
                nn.Linear(f, d, bias=False)
            self.layers.append(layer)
        self.norm = nn.Parameter(torch.ones(d))
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        self.requires_grad_(False)

    def make_cache(self, batch_size: int = 1, max_seq_len: int | None = None) -> KVCache:
        w = self.lm_head.weight
        return KVCache(self.config, batch_size, max_seq_len, dtype=w.dtype, device=w.device)

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.norm_eps) * w

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        cfg = self.config
        B, T = input_ids.shape
        start = 0 if cache is None else cache.seq_len
        if cache is not None and start + T > cache.max_seq_len:
            raise ValueError(f"the cache holds {cache.max_seq_len} positions: {start} + {T} do not fit")
        H, D = cfg.n_heads, cfg.head_dim
        pos = torch.arange(start, start + T, device=input_ids.device)
        x = self.tok_emb(input_ids)                                                   # (B, T, d)
        for i, layer in enumerate(self.layers):
            h = self._rms(x, layer.attn_norm)
            q, k, v = layer.wqkv(h).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)       # each (B, H, T, D)
            q, k = _rope(q, pos, cfg.rope_theta), _rope(k, pos, cfg.rope_theta)
            if cache is not None:
                cache.k[i][:, :, start:start + T] = k
                cache.v[i][:, :, start:start + T] = v
                k, v = cache.k[i][:, :, :start + T], cache.v[i][:, :, :start + T]
            # bottom-right causal mask: query t (position start + t) sees keys 0 .. start + t
            allowed = torch.arange(start + T, device=x.device)[None, :] <= pos[:, None]
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)         # (B, H, T, D)
            x = x + layer.wo(att.transpose(1, 2).reshape(B, T, H * D))
            h = self._rms(x, layer.mlp_norm)
            x = x + layer.w2(F.silu(layer.w1(h)) * layer.w3(h))
        if cache is not None:
            cache.seq_len = start + T
        return self.lm_head(self._rms(x, self.norm))


def make_model(config: ModelConfig | None = None, seed: int = 0) -> TinyDecoder:
    """A ``TinyDecoder`` whose weights come from ``torch.Generator().manual_seed(seed)``: linear
    weights ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm weights 1."""
    model = TinyDecoder(config)
    g = torch.Generator().manual_seed(int(seed))
    for name, p in model.named_parameters():
        if name.endswith("norm"):
            continue
        p.copy_(torch.randn(p.shape, generator=g) / (1.0 if p.dim() == 1 or "tok_emb" in name
                                                     else math.sqrt(p.shape[1])))
    return model


# --- Part A: sampling distributions and the verification step ---------------------------------

def _check_sampling(temperature, top_k, top_p) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or math.isnan(temperature) \
            or temperature < 0:
        raise ValueError(f"temperature must be a real number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None) -> torch.Tensor:
    """The sampling distribution of each row of ``logits (..., V)``: temperature, then top-k (ties
    at the boundary kept), then top-p on the renormalised distribution (stable descending order;
    a token is kept iff the mass before it is < top_p), softmax over the kept tokens.
    float64 for float64 logits, float32 otherwise."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating tensor, got {getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (..., V) with V >= 1, got shape {tuple(logits.shape)}")
    _check_sampling(temperature, top_k, top_p)
    z = logits.to(torch.float64)
    if bool(torch.isnan(z).any()) or bool((z == math.inf).any()):
        raise ValueError("logits hold NaN or +inf (only -inf, a forbidden token, is allowed)")
    if bool((z == -math.inf).all(-1).any()):
        raise ValueError("logits: a row forbids every token (all -inf)")
    return _probs(logits, temperature, top_k, top_p)


def _probs(logits, temperature, top_k, top_p):
    """``logits_to_probs`` without the checks (the loop's own logits)."""
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    z = logits.to(torch.float64)
    if temperature == 0:
        return F.one_hot(z.argmax(-1), z.shape[-1]).to(out_dtype)
    z = z / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = z.topk(int(top_k), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, -math.inf)
    if top_p is not None and top_p < 1:
        probs = torch.softmax(z, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = sorted_p.cumsum(-1) - sorted_p                                       # mass before each token
        drop = torch.zeros_like(z, dtype=torch.bool).scatter(-1, order, before >= top_p)
        z = z.masked_fill(drop, -math.inf)
    return torch.softmax(z, dim=-1).to(out_dtype)


def _check_probs(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
        raise ValueError(f"{name} holds a negative or non-finite probability")
    if t.numel() and bool(((t.sum(-1, dtype=torch.float64) - 1).abs() > 1e-3).any()):
        raise ValueError(f"{name}: a row does not sum to 1 (within 1e-3)")


def speculative_sample(draft_probs: torch.Tensor, target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One verification step for B rows: accept x_i iff ``u * q_i(x_i) < p_i(x_i)`` (u ~ U[0, 1)),
    at the first rejection n emit a token from ``norm(max(0, p_n - q_n))``, after gamma acceptances
    the bonus token from ``p_gamma``. Returns ``tokens (B, gamma+1)`` int64 (-1 after the emitted
    ones) and ``num_accepted (B,)`` int64."""
    for name, t, rank in (("draft_probs", draft_probs, 3), ("target_probs", target_probs, 3),
                          ("draft_tokens", draft_tokens, 2)):
        if not isinstance(t, torch.Tensor) or t.dim() != rank:
            raise ValueError(f"{name} must be a tensor of rank {rank}, got {getattr(t, 'shape', type(t).__name__)}")
    if draft_tokens.dtype != torch.int64:
        raise TypeError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
    if draft_probs.dtype not in (torch.float32, torch.float64) or target_probs.dtype != draft_probs.dtype:
        raise TypeError(f"draft_probs and target_probs must be both float32 or both float64, got "
                        f"{draft_probs.dtype} and {target_probs.dtype}")
    B, gamma, V = draft_probs.shape
    if target_probs.shape != (B, gamma + 1, V):
        raise ValueError(f"target_probs must be (B, gamma+1, V) = {(B, gamma + 1, V)}, got {tuple(target_probs.shape)}")
    if draft_tokens.shape != (B, gamma):
        raise ValueError(f"draft_tokens must be (B, gamma) = {(B, gamma)}, got {tuple(draft_tokens.shape)}")
    if B < 1 or V < 1:
        raise ValueError(f"draft_probs: B and V must be >= 1, got shape {tuple(draft_probs.shape)}")
    _check_probs("draft_probs", draft_probs)
    _check_probs("target_probs", target_probs)
    if bool(((draft_tokens < 0) | (draft_tokens >= V)).any()):
        raise ValueError(f"draft_tokens: a token outside [0, V={V})")
    if bool((draft_probs.gather(-1, draft_tokens[..., None]) == 0).any()):
        raise ValueError("draft_tokens: a proposed token has draft probability 0 (it cannot come from q)")
    return _verify(draft_probs, target_probs, draft_tokens, generator)


def _verify(draft_probs, target_probs, draft_tokens, generator):
    """``speculative_sample`` without the checks (the loop's own distributions)."""
    B, gamma, V = draft_probs.shape
    q_x = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)               # (B, gamma)
    p_x = target_probs[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1)   # (B, gamma)
    u = torch.rand((B, gamma), generator=generator, dtype=draft_probs.dtype, device=draft_probs.device)
    accept = u * q_x < p_x
    n = accept.to(torch.int64).cumprod(-1).sum(-1)                                  # accepted prefix (B,)
    rows = torch.arange(B, device=n.device)
    p_n = target_probs[rows, n]                                                     # (B, V)
    q_pad = torch.cat([draft_probs, draft_probs.new_zeros(B, 1, V)], dim=1)         # q_gamma = 0: bonus = p_gamma
    residual = (p_n - q_pad[rows, n]).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)        # rounding only
    last = torch.multinomial(residual, 1, generator=generator).squeeze(-1)          # (B,)
    pos = torch.arange(gamma + 1, device=n.device)
    tokens = torch.cat([draft_tokens, draft_tokens.new_full((B, 1), -1)], dim=1)
    tokens = torch.where(pos[None] < n[:, None], tokens, -1)
    tokens[rows, n] = last
    return tokens, n


def _draw(w: torch.Tensor, generator) -> int:
    """One index from the weights ``w (V,)``: a uniform against their CDF (for one draw, several times cheaper
    than ``torch.multinomial``); a zero weight is never drawn."""
    cdf = w.to(torch.float64).cumsum(0).tolist()
    u = float(torch.rand((), generator=generator, dtype=torch.float64, device=w.device)) * cdf[-1]
    i = bisect.bisect_right(cdf, u)
    while i >= len(cdf) or (i > 0 and cdf[i] == cdf[i - 1]):   # u rounded onto the total: the last positive weight
        i -= 1
    return i


def _verify_one(q: torch.Tensor, p: torch.Tensor, props: list[int], generator) -> tuple[int, int]:
    """``_verify`` for one row (the loop's: q ``(g, V)``, p ``(g+1, V)``, float64), with Python scalars:
    ``(n accepted, the correction or bonus token)``."""
    g = len(props)
    if g:
        idx = torch.tensor(props, device=q.device)[:, None]
        q_x, p_x = q.gather(1, idx)[:, 0].tolist(), p[:g].gather(1, idx)[:, 0].tolist()
        u = torch.rand(g, generator=generator, dtype=torch.float64, device=q.device).tolist()
    n = 0
    while n < g and u[n] * q_x[n] < p_x[n]:
        n += 1
    w = p[n] if n == g else (p[n] - q[n]).clamp_min(0)   # the bonus from p_g, else the residual
    if n < g and not bool(w.any()):
        w = p[n]                                         # rounding only
    return n, _draw(w, generator)


# --- Part B: the speculative loop --------------------------------------------------------------

@dataclass
class SpecStats:
    """What a speculative run cost: model calls (prefill included), verification blocks, draft
    tokens proposed and accepted (correction and bonus tokens not counted)."""

    target_calls: int = 0
    draft_calls: int = 0
    blocks: int = 0
    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_block(self) -> float:
        return (self.accepted + self.blocks) / self.blocks if self.blocks else 0.0


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@torch.no_grad()
def speculative_generate(target, draft, input_ids: torch.Tensor, gamma: int, max_new_tokens: int,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None) -> tuple[torch.Tensor, SpecStats]:
    """Generate exactly ``max_new_tokens`` tokens after ``input_ids (1, L)``: blocks of
    ``min(gamma, left - 1)`` draft proposals verified by ONE target call, both caches cropped to
    the accepted length. Returns ``(output_ids (1, L + max_new_tokens) int64, SpecStats)``."""
    if not _is_int(gamma) or gamma < 1:
        raise ValueError(f"gamma must be an int >= 1, got {gamma!r}")
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    _check_sampling(temperature, top_k, top_p)
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids must be a (1, L) int64 tensor, got {type(input_ids).__name__}")
    if input_ids.dtype != torch.int64:
        raise TypeError(f"input_ids must be int64, got {input_ids.dtype}")
    V = target.config.vocab_size
    if draft.config.vocab_size != V:
        raise ValueError(f"vocab_size: the draft's {draft.config.vocab_size} != the target's {V}")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be (1, L) with L >= 1, got {tuple(input_ids.shape)}")
    if bool(((input_ids < 0) | (input_ids >= V)).any()):
        raise ValueError(f"input_ids: a token outside [0, vocab_size={V})")
    L = input_ids.shape[1]
    total = L + max_new_tokens
    for who, m in (("target", target), ("draft", draft)):
        if total > m.config.max_seq_len:
            raise ValueError(f"L + max_new_tokens = {total} exceeds the {who}'s max_seq_len {m.config.max_seq_len}")
    stats = SpecStats()
    if max_new_tokens == 0:
        return input_ids.clone(), stats
    device = input_ids.device
    seq = input_ids[0].tolist()
    t_cache, d_cache = target.make_cache(1, total), draft.make_cache(1, total)

    def probs(logits):
        return _probs(logits, temperature, top_k, top_p).to(torch.float64)     # arguments checked above

    while len(seq) < total:
        N = len(seq)
        g = min(gamma, total - N - 1)
        props, qs = [], []
        for _ in range(g):                       # the draft proposes g tokens, one call each
            feed = (seq + props)[d_cache.seq_len:]
            q = probs(draft(torch.tensor([feed], device=device), cache=d_cache)[0, -1])
            stats.draft_calls += 1
            x = int(q.argmax()) if temperature == 0 else _draw(q, generator)
            props.append(x)
            qs.append(q)
        feed = (seq + props)[t_cache.seq_len:]   # ONE target call verifies all g
        p = probs(target(torch.tensor([feed], device=device), cache=t_cache)[0, -(g + 1):])
        stats.target_calls += 1
        n, last = _verify_one(torch.stack(qs) if qs else p[:0], p, props, generator)
        seq += props[:n] + [last]
        stats.blocks += 1
        stats.proposed += g
        stats.accepted += n
        t_cache.crop(min(t_cache.seq_len, N + n))   # the emitted sequence minus its last token
        d_cache.crop(min(d_cache.seq_len, N + n))
    return torch.tensor([seq], dtype=torch.int64, device=device), stats


# --- Part C: distillation losses ----------------------------------------------------------------

def _prepare(student_logits, teacher_logits, labels, temperature, ignore_index):
    """``(log p_S, log p_T, valid mask)`` at ``temperature``, in float32 (float64 for a float64 student)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) \
            or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher_logits must have the student's shape {tuple(student_logits.shape)}, got "
                         f"{tuple(teacher_logits.shape)}")
    dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
    log_ps = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    log_pt = F.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)
    if labels is None:
        valid = torch.ones(student_logits.shape[:-1], dtype=torch.bool, device=student_logits.device)
    else:
        if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():
            raise TypeError(f"labels must be an integer tensor, got {labels.dtype}")
        if labels.shape != student_logits.shape[:-1]:
            raise ValueError(f"labels must be logits.shape[:-1] = {tuple(student_logits.shape[:-1])}, got "
                             f"{tuple(labels.shape)}")
        valid = labels != ignore_index
    return log_ps, log_pt, valid


def _token_mean(per_token: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Sum over the valid tokens / their number (0 when none); ignored tokens get no gradient."""
    return torch.where(valid, per_token, 0).sum() / valid.sum().clamp_min(1)


def _kl(log_a, log_b):
    """Per token ``KL(a || b) = sum_v a (log a - log b)``."""
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def forward_kl(student_logits, teacher_logits, labels=None, temperature=1.0, ignore_index=-100):
    """Mean over valid tokens of ``KL(p_T || p_S)``, both at ``temperature``."""
    log_ps, log_pt, valid = _prepare(student_logits, teacher_logits, labels, temperature, ignore_index)
    return _token_mean(_kl(log_pt, log_ps), valid)


def reverse_kl(student_logits, teacher_logits, labels=None, temperature=1.0, ignore_index=-100):
    """Mean over valid tokens of ``KL(p_S || p_T)``."""
    log_ps, log_pt, valid = _prepare(student_logits, teacher_logits, labels, temperature, ignore_index)
    return _token_mean(_kl(log_ps, log_pt), valid)


def generalized_jsd(student_logits, teacher_logits, labels=None, beta=0.5, temperature=1.0, ignore_index=-100):
    """GKD's generalized JSD (TRL): ``beta KL(p_T || M) + (1 - beta) KL(p_S || M)``,
    ``M = beta p_T + (1 - beta) p_S``; beta = 0 is KL(p_T || p_S), beta = 1 is KL(p_S || p_T)."""
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 <= beta <= 1:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    log_ps, log_pt, valid = _prepare(student_logits, teacher_logits, labels, temperature, ignore_index)
    if beta == 0:
        per = _kl(log_pt, log_ps)
    elif beta == 1:
        per = _kl(log_ps, log_pt)
    else:
        log_m = torch.logsumexp(torch.stack([log_pt + math.log(beta), log_ps + math.log(1 - beta)]), dim=0)
        per = beta * _kl(log_pt, log_m) + (1 - beta) * _kl(log_ps, log_m)
    return _token_mean(per, valid)


def distillation_loss(student_logits, teacher_logits, labels, temperature=1.0, alpha=0.5, ignore_index=-100):
    """Hinton et al.: ``alpha * T^2 * forward_kl(T) + (1 - alpha) * CE`` (CE at temperature 1),
    both averaged over the same valid tokens."""
    if labels is None:
        raise ValueError("labels are required by distillation_loss (the hard-label term)")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    log_ps, log_pt, valid = _prepare(student_logits, teacher_logits, labels, temperature, ignore_index)
    V = student_logits.shape[-1]
    if bool(((labels[valid] < 0) | (labels[valid] >= V)).any()):
        raise ValueError(f"labels: a valid label outside [0, V={V})")
    soft = _token_mean(_kl(log_pt, log_ps), valid)
    log_p1 = F.log_softmax(student_logits.to(log_ps.dtype), dim=-1)                # temperature 1
    nll = -log_p1.gather(-1, torch.where(valid, labels, 0).long()[..., None]).squeeze(-1)
    hard = _token_mean(nll, valid)
    return alpha * temperature ** 2 * soft + (1 - alpha) * hard
