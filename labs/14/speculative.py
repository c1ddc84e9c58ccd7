"""Lab 14: speculative decoding and knowledge distillation (stub: the given parts are finished; yours raise NotImplementedError).

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


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None) -> torch.Tensor:
    """The sampling distribution of each row of ``logits (..., V)``.

    Steps, in this order (vLLM / HF order, contract notes 6):
      * ``temperature == 0``: one-hot at the first maximal logit (``torch.argmax``, ties to the lower
        index); top_k and top_p change nothing.
      * ``z = logits / temperature`` (upcast first: compute in float64 or float32, never bfloat16).
      * ``top_k`` (int >= 1 or None): keep the tokens with ``z >=`` the k-th largest ``z`` of the row
        (ties at the boundary ALL kept; ``k >= V`` keeps all).
      * ``top_p`` (float in (0, 1] or None): on the softmax over the tokens top-k kept, order tokens by
        descending probability, ties by lower index (``torch.sort(descending=True, stable=True)``);
        keep a token iff the mass of the tokens BEFORE it is < top_p (the crossing token is kept).
        ``top_p = 1.0`` filters nothing.
      * softmax of ``z`` over the kept tokens, exact zeros elsewhere (stable: subtract the row max).

    Args: logits any floating dtype, any layout, V >= 1; ``-inf`` marks a forbidden token.
    Returns: same shape; float64 for float64 logits, float32 otherwise; rows sum to 1.
    Raises: ValueError naming ``temperature`` (negative, NaN, not a real), ``top_k`` (not an int >= 1),
        ``top_p`` (outside (0, 1]); ValueError for 0-dim logits, V = 0, NaN or +inf logits;
        TypeError for non-floating logits.
    """
    raise NotImplementedError("Part A: temperature (0: one-hot argmax), then top-k keeping boundary ties, then top-p on the renormalised distribution; softmax over the kept tokens")



def speculative_sample(draft_probs: torch.Tensor, target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One verification step of speculative sampling for B independent rows.

    Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2 (their p and q are swapped:
    HERE p is the target, q the draft). For each row, for i = 0..gamma-1: draw u ~ U[0, 1) and accept
    x_i iff ``u * q_i(x_i) < p_i(x_i)``. At the first rejection n, emit one token from
    ``max(0, p_n - q_n)`` normalised (if it sums to 0, only rounding can cause it, sample ``p_n``);
    if all gamma are accepted, emit the bonus token from ``p_gamma`` (the target's LAST row).

    Args:
        draft_probs: ``(B, gamma, V)`` q_i, float32 or float64.
        target_probs: ``(B, gamma+1, V)`` p_i, the same dtype (p_i: the target's distribution after
            x_0..x_{i-1}).
        draft_tokens: ``(B, gamma)`` int64, x_i drawn from q_i.
        generator: every random number comes from it (else the device's default generator).
    Returns:
        ``tokens (B, gamma+1)`` int64: the accepted prefix, then the correction/bonus token, then -1;
        ``num_accepted (B,)`` int64 in [0, gamma] (the accepted PREFIX length).
    Raises: ValueError naming the argument for a wrong rank or shapes that disagree, a token outside
        [0, V) or of draft probability 0 (``draft_tokens``), a negative/non-finite probability or a
        row more than 1e-3 from summing to 1; TypeError for non-int64 tokens or probabilities not
        both float32 or both float64. Inputs are never modified.
    """
    raise NotImplementedError("Part A: accept x_i iff u * q_i(x_i) < p_i(x_i); at the first rejection sample norm(max(0, p_n - q_n)); after gamma acceptances the bonus from p_gamma")


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
        raise NotImplementedError("Part B: accepted / proposed (0.0 when nothing was proposed)")

    @property
    def tokens_per_block(self) -> float:
        return (self.accepted + self.blocks) / self.blocks if self.blocks else 0.0
        raise NotImplementedError("Part B: (accepted + blocks) / blocks (0.0 when no block ran)")



def speculative_generate(target, draft, input_ids: torch.Tensor, gamma: int, max_new_tokens: int,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None) -> tuple[torch.Tensor, SpecStats]:
    """Speculative decoding of exactly ``max_new_tokens`` tokens after ``input_ids (1, L)``.

    Uses only ``model.config.vocab_size``, ``model.config.max_seq_len``, ``model.make_cache(1, n)``,
    ``model(input_ids (1, T), cache=cache) -> logits (1, T, V)`` and the cache's ``seq_len`` and
    ``crop(n)``. With N tokens emitted and R = L + max_new_tokens - N left, a block:
      1. gamma_b = min(gamma, R - 1) draft calls, each adding one proposal drawn from
         ``q = logits_to_probs(draft logits, temperature, top_k, top_p)`` (the first call feeds every
         emitted token the draft cache lacks);
      2. ONE target call on the emitted tokens the target cache lacks plus the gamma_b proposals; its
         last gamma_b + 1 rows give p_0..p_gamma_b (same processing as q);
      3. verification as ``speculative_sample``: n accepted proposals plus one correction/bonus token;
      4. both caches cropped to at most N + n (the KV rollback): the target cache then holds the
         emitted sequence minus its last token.
    Temperature 0 gives the target's greedy decoding token for token. Runs under ``torch.no_grad``.

    Returns: ``(output_ids (1, L + max_new_tokens) int64, SpecStats)``; ``max_new_tokens = 0`` returns
        the prompt and calls no model.
    Raises (before any model call): ValueError naming ``gamma`` (not an int >= 1),
        ``max_new_tokens`` (not an int >= 0), ``input_ids`` (not (1, L), L >= 1, or ids outside the
        vocabulary), ``vocab_size`` (draft and target differ), ``max_seq_len`` (L + max_new_tokens too
        long for either model); TypeError for non-int64 input_ids; temperature/top_k/top_p as
        ``logits_to_probs``.
    """
    raise NotImplementedError("Part B: draft gamma_b = min(gamma, left - 1) proposals, ONE target call, speculative_sample, crop both caches to the accepted length")


# --- Part C: distillation losses ----------------------------------------------------------------




def forward_kl(student_logits, teacher_logits, labels=None, temperature=1.0, ignore_index=-100):
    """Mean over the valid tokens of ``KL(p_T || p_S) = sum_v p_T (log p_T - log p_S)``.

    Hinton, Vinyals and Dean 2015 (soft targets). ``p = softmax(logits / temperature)``, both sides from
    ``log_softmax`` (never ``log(softmax)``), in float32 (float64 for float64 student logits).
    Args: student_logits, teacher_logits ``(..., V)`` of the same shape (dtypes may differ);
        labels an integer tensor of shape ``logits.shape[:-1]`` or None (every position counts);
        positions with ``labels == ignore_index`` are excluded (their gradient is exactly 0).
    Returns: 0-dim tensor, the sum over valid tokens / their number (0 when none). The teacher is a
        constant (no gradient reaches it). The value is the KL, not the soft-target cross-entropy.
    Raises: ValueError naming ``temperature`` (not finite > 0), ``teacher_logits`` (shape),
        ``labels`` (shape); TypeError naming ``labels`` (floating or bool).
    """
    raise NotImplementedError("Part C: mean over valid tokens of KL(p_T || p_S) from log_softmax(logits / T) on both sides")


def reverse_kl(student_logits, teacher_logits, labels=None, temperature=1.0, ignore_index=-100):
    """Mean over the valid tokens of ``KL(p_S || p_T)`` (mode-seeking); otherwise as ``forward_kl``."""
    raise NotImplementedError("Part C: mean over valid tokens of KL(p_S || p_T)")


def generalized_jsd(student_logits, teacher_logits, labels=None, beta=0.5, temperature=1.0, ignore_index=-100):
    """GKD's generalized Jensen-Shannon divergence (Agarwal et al. 2024, Eq. 1; TRL's GKDTrainer).

    For 0 < beta < 1: ``M = beta p_T + (1 - beta) p_S`` (log M by ``logsumexp(log p_T + log beta,
    log p_S + log(1 - beta))``), per token ``beta KL(p_T || M) + (1 - beta) KL(p_S || M)``;
    ``beta = 0`` is ``KL(p_T || p_S)``, ``beta = 1`` is ``KL(p_S || p_T)``. Symmetric at beta = 0.5.
    Masking, dtype and errors as ``forward_kl``; ``beta`` outside [0, 1] -> ValueError naming ``beta``.
    """
    raise NotImplementedError("Part C: GKD's beta KL(p_T||M) + (1-beta) KL(p_S||M), M = beta p_T + (1-beta) p_S; beta 0 / 1 are forward / reverse KL")


def distillation_loss(student_logits, teacher_logits, labels, temperature=1.0, alpha=0.5, ignore_index=-100):
    """Hinton et al.: ``alpha * T^2 * forward_kl(T) + (1 - alpha) * CE``.

    CE is the student's hard-label cross-entropy at temperature 1 (``F.cross_entropy`` with
    ``ignore_index``); both terms are averaged over the same valid tokens. T^2 keeps the soft
    gradients' scale independent of T.
    Raises: ValueError naming ``labels`` (None, or a valid label outside [0, V)), ``alpha`` (outside
        [0, 1]); otherwise as ``forward_kl``.
    """
    raise NotImplementedError("Part C: alpha * T^2 * forward_kl(T) + (1 - alpha) * cross-entropy at T = 1, over the same valid tokens")
