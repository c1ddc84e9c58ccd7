"""Lab 05: a KV cache for a small Llama-style decoder.

What you build
  Part A  the cached attention path of ``Attention.forward``, ``KVCache`` and greedy
          ``generate``: cached decoding that equals full recomputation, at a
          per-step cost that does not grow with position (except attention's).
  Part B  (bonus) ``PagedKVCache``: K/V storage in fixed-size blocks shared by many
          sequences, each with its own block table (vLLM's PagedAttention).

Test as you go:  ``pytest labs/05`` (visible tests), ``pytest labs/05 -k paged``
(Part B only), ``labs grade . --lab 05`` (self-grade with the hidden graders when
present). Everything runs on CPU.

The decoder (``ModelConfig``, ``RMSNorm``, ``RotaryEmbedding``, ``attend``, ``MLP``,
``Block``, ``Transformer``) is finished: graders build it from this file with
``Transformer(ModelConfig(vocab_size=..., d_model=..., n_layers=..., n_heads=...,
n_kv_heads=..., max_seq_len=..., ffn_hidden=...))``, draw new weights and read them by
the attribute names used here, so keep those names and the uncached path as they are.
Your work: the ``cache``/``attention_mask`` path of ``Attention.forward``, ``KVCache``,
``generate`` and ``PagedKVCache``.

Shapes: B batch, T new tokens this call, S positions already cached, L prompt
length, H query heads, Hkv KV heads, D head_dim, V vocab.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- The model (finished) -------------------------------------------------------------

@dataclass
class ModelConfig:
    """Hyper-parameters of the decoder. ``head_dim = d_model // n_heads``."""

    vocab_size: int = 96       # V
    d_model: int = 48          # residual width
    n_layers: int = 2
    n_heads: int = 4           # H query heads
    n_kv_heads: int = 2        # Hkv KV heads (GQA: H % Hkv == 0)
    max_seq_len: int = 320     # longest sequence RoPE tables cover (prompt + generated)
    ffn_hidden: int = 128      # SwiGLU hidden width
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "max_seq_len", "ffn_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig: {name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig: d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelConfig: n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig: head_dim={self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer, Su et al. 2021), rotate-half layout
    (GPT-NeoX / Hugging Face Llama): channel pairs ``(i, i + D/2)`` rotate by angle
    ``pos * theta ** (-2i / D)``. Tables cover positions ``0 .. max_seq_len-1``."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
        angles = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (max_seq_len, D/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x: (B, heads, T, D)``, ``positions: (B, T)`` int64 -> rotated ``x``, same shape.
        Raises ValueError for a position outside ``0 .. max_seq_len-1``."""
        n = self.cos.shape[0]
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= n):
            raise ValueError(f"RoPE positions must lie in [0, max_seq_len={n}), got "
                             f"{int(positions.min())}..{int(positions.max())}")
        cos = self.cos[positions][:, None]  # (B, 1, T, D/2)
        sin = self.sin[positions][:, None]
        x1, x2 = x.chunk(2, dim=-1)  # (B, heads, T, D/2) each
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax attention with grouped KV heads and a boolean mask.

    ``q: (B, H, Lq, D)``, ``k, v: (B, Hkv, Lk, D)`` with ``H % Hkv == 0`` (query head
    ``h`` reads KV head ``h // (H // Hkv)``); ``allowed``: bool, 4-d ``(B or 1, 1, Lq, Lk)``,
    True where query ``i`` may attend key ``j``. Returns
    ``(B, H, Lq, D)``. Scale ``1/sqrt(D)``. A row with no allowed key gives zeros
    (never NaN): scores are shifted by the row max, an empty row by 0.
    """
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    G = H // Hkv  # query heads per KV head
    s = (q.reshape(B, Hkv, G * Lq, D) @ k.transpose(-1, -2)) / math.sqrt(D)  # (B, Hkv, G*Lq, Lk)
    s = s.view(B, Hkv, G, Lq, Lk).masked_fill(~allowed[:, :, None], float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)  # (B, Hkv, G, Lq, Lk)
    l = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(l == 0, torch.ones_like(l), l)
    return (p.view(B, Hkv, G * Lq, Lk) @ v).view(B, H, Lq, D)


# --- Part A: the cached attention path ---------------------------------------------------

class Attention(nn.Module):
    """Grouped-query self-attention (Ainslie et al. 2023) with RoPE and an optional KV cache.

    Weights: ``wq (H*D x d_model)``, ``wk, wv (Hkv*D x d_model)``, ``wo (d_model x H*D)``,
    no biases. ``layer_idx`` is this layer's slot in a ``KVCache``.
    """

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = nn.Linear(config.d_model, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.d_model, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.d_model, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, cache: "KVCache | None" = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x: (B, T, d_model)`` -> ``(B, T, d_model)``.

        ``cache``: S = ``cache.seq_len`` positions are already stored; this call's K/V
        are appended with ``cache.update(self.layer_idx, k, v)`` and attention runs over
        all ``S + T`` keys. Read ``cache.seq_len`` before updating: it advances only
        after the last layer, so every layer sees the same S.
        ``attention_mask: (B, S + T)``, 1 = real token, 0 = left padding, covering the
        cached and the new tokens.

        Positions (RoPE): new token ``t`` sits at ``S + t`` without a mask; with a mask,
        at the number of real tokens before it in its row (``cumsum(mask) - 1``, clamped
        at 0), so a left-padded prompt gets the positions it would have alone.
        Mask: query ``i`` may attend key ``j`` iff ``j <= i + S`` (bottom-right causal,
        ``Lk = S + T``) and key ``j`` is not padding. ``attend`` takes that boolean mask.
        """
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)     # (B, H, T, D)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        if cache is None and attention_mask is None:
            # the finished uncached path: positions 0..T-1, square causal mask
            positions = torch.arange(T, device=x.device).expand(B, T)  # (B, T)
            q, k = rope(q, positions), rope(k, positions)
            allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[None, None]  # (1, 1, T, T)
            y = attend(q, k, v, allowed)  # (B, H, T, D)
            return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
        # TODO Part A: positions from cache.seq_len (or from attention_mask), RoPE, then
        # k, v = cache.update(self.layer_idx, k, v) when there is a cache, then the
        # bottom-right causal mask (and padded keys off), attend, wo.
        raise NotImplementedError("Part A: Attention.forward with a cache or an attention_mask: continue RoPE "
                                  "positions from cache.seq_len (or cumsum(attention_mask) - 1), append K/V with "
                                  "cache.update, mask bottom-right causal and padded keys")


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.ffn_hidden, bias=False)  # gate
        self.w3 = nn.Linear(config.d_model, config.ffn_hidden, bias=False)  # up
        self.w2 = nn.Linear(config.ffn_hidden, config.d_model, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(attn_norm(x))``, then ``x + mlp(mlp_norm(x))``."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope, cache=None, attention_mask=None):
        x = x + self.attn(self.attn_norm(x), rope, cache, attention_mask)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Llama-style decoder: ``tok_emb -> layers[0..n_layers-1] -> norm -> lm_head``
    (untied head, no biases, RoPE in every attention layer)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.rope = RotaryEmbedding(config.head_dim, config.max_seq_len, config.rope_theta)
        for name, p in self.named_parameters():  # nanoGPT-style init
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, input_ids: torch.Tensor, cache: "KVCache | None" = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``input_ids: (B, T)`` int64 -> logits ``(B, T, V)`` float32.

        With ``cache`` (S = ``cache.seq_len`` positions stored), the T tokens follow
        the cached ones and their K/V are appended. ``attention_mask``: ``(B, S + T)``
        of 0/1 (or bool), 1 = real token, 0 = left padding, covering cached and new
        tokens. Raises ValueError for a bad shape, TypeError for non-int64 ids.
        """
        if input_ids.dtype != torch.int64:
            raise TypeError(f"input_ids must be int64, got {input_ids.dtype}")
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise ValueError(f"input_ids must be (B, T) with T >= 1, got shape {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        S = cache.seq_len if cache is not None else 0
        if attention_mask is not None and tuple(attention_mask.shape) != (B, S + T):
            raise ValueError(f"attention_mask must be (B, cached + new) = {(B, S + T)}, "
                             f"got shape {tuple(attention_mask.shape)}")
        x = self.tok_emb(input_ids)  # (B, T, d_model)
        for layer in self.layers:
            x = layer(x, self.rope, cache, attention_mask)
        return self.lm_head(self.norm(x))  # (B, T, V)


# --- Part A: KVCache ----------------------------------------------------------------

class KVCache:
    """Preallocated K/V storage for the ``n_layers`` attention layers of one batch.

    ``__init__`` allocates the storage once, for example
    ``k, v: (n_layers, batch_size, n_kv_heads, max_seq_len, head_dim)`` of ``dtype`` on
    ``device``, and nothing after that: ``update`` writes into it, never ``torch.cat``.
    Attributes the graders read:
      ``seq_len``  int, positions stored (0 when new or after ``reset()``);
      ``nbytes``   int, ``2 * n_layers * batch_size * n_kv_heads * max_seq_len * head_dim
                   * element_size`` (the storage, in bytes).
    Raises ValueError for a non-positive size, TypeError for a non-floating ``dtype``.
    """

    def __init__(self, n_layers, batch_size, max_seq_len, n_kv_heads, head_dim,
                 dtype=torch.float32, device="cpu"):
        # TODO Part A: check the sizes, allocate k and v storage once, set seq_len and nbytes.
        raise NotImplementedError("Part A: KVCache.__init__: preallocate K/V storage "
                                  "(n_layers, batch_size, n_kv_heads, max_seq_len, head_dim) once; seq_len = 0; nbytes")

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v: (B, Hkv, T, D)`` (``B = batch_size``, ``Hkv = n_kv_heads``,
        ``D = head_dim``, ``T >= 1``; any layout) at positions ``seq_len .. seq_len+T-1``
        of layer ``layer_idx``.

        Returns ``(k_all, v_all)``: views ``(B, Hkv, seq_len + T, D)`` of that layer's
        stored prefix (slices of the storage, not copies; never the slots past it).
        In one forward the layers call ``update`` in order ``0 .. n_layers-1`` with the
        same T; ``seq_len`` advances by T when layer ``n_layers - 1`` is updated.
        Raises:
          ValueError  bad ``layer_idx``; k or v not ``(batch_size, n_kv_heads, T>=1,
                      head_dim)``, or of different shapes; on another device than the
                      cache; ``seq_len + T > max_seq_len`` (the message names
                      ``max_seq_len``; check before writing: no byte of the storage changes).
                      Filling exactly to ``max_seq_len`` is allowed.
          TypeError   k or v dtype differs from the cache's ``dtype``.
        """
        raise NotImplementedError("Part A: KVCache.update: validate, check overflow before writing, write "
                                  "k/v at [seq_len, seq_len+T), advance seq_len after the last layer, return "
                                  "views of the stored prefix")

    def reset(self) -> None:
        """Empty the cache: ``seq_len = 0`` (keep the storage)."""
        raise NotImplementedError("Part A: KVCache.reset: set seq_len back to 0")


# --- Part A: generate ----------------------------------------------------------------

@torch.no_grad()
def generate(model, input_ids, max_new_tokens, attention_mask=None, use_cache=True):
    """Greedy decoding with ``model`` (a ``Transformer``).

    ``input_ids: (B, L)`` int64, left padded where ``attention_mask (B, L)`` (0/1) has
    zeros; ``max_new_tokens >= 0``. Returns ``(B, L + max_new_tokens)`` int64: the prompt,
    then at each step the argmax of the last position's logits.
    With ``use_cache`` build a ``KVCache(cfg.n_layers, B, L + max_new_tokens,
    cfg.n_kv_heads, cfg.head_dim, dtype=<the model's dtype>, device=input_ids.device)``
    (``cfg = model.config``), run the whole prompt once (prefill), then feed one token per
    step; without it, rerun the whole sequence every step. Extend ``attention_mask`` by a
    1 per generated token and pass it as ``model(ids, cache=..., attention_mask=...)``.
    Both ways give the same tokens, and each row the tokens of its prompt alone.
    Raises ValueError when ``L + max_new_tokens > model.config.max_seq_len``, for a bad
    shape or a mask that is not left padding; TypeError for non-int64 ids.
    """
    raise NotImplementedError("Part A: generate: greedy decoding, prefill the prompt into a KVCache then "
                              "one token per step (or recompute everything when use_cache=False)")


# --- Part B (bonus): PagedKVCache ----------------------------------------------------------

class PagedKVCache:
    """K/V storage in fixed-size blocks shared by many sequences (PagedAttention,
    Kwon et al. 2023, vLLM).

    ``__init__`` allocates once ``num_blocks`` blocks of ``block_size`` positions per
    layer, e.g. ``k_blocks, v_blocks: (n_layers, num_blocks, n_kv_heads, block_size,
    head_dim)``, and never reallocates. ``nbytes`` (int) = ``2 * n_layers * num_blocks
    * n_kv_heads * block_size * head_dim * element_size``.
    Each live sequence (any hashable ``seq_id``) owns a block table: physical block ids
    in logical order; position ``p`` lives in block ``table[p // block_size]`` at slot
    ``p % block_size``. Blocks are taken from the free pool only when a position needs
    one, so a sequence holds exactly ``ceil(seq_len / block_size)`` blocks (fewer than
    ``block_size`` wasted slots) and ``num_free_blocks + sum of table lengths ==
    num_blocks``. Raises ValueError for a non-positive size, TypeError for a
    non-floating ``dtype``.
    """

    def __init__(self, num_blocks, block_size, n_layers, n_kv_heads, head_dim,
                 dtype=torch.float32, device="cpu"):
        raise NotImplementedError("Part B: PagedKVCache.__init__: preallocate the block storage, a free pool "
                                  "of block ids and empty block tables; nbytes")

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free pool."""
        raise NotImplementedError("Part B: PagedKVCache.num_free_blocks")

    def allocate(self, seq_id) -> None:
        """Start an empty sequence ``seq_id`` (seq_len 0, no blocks). ValueError if it is live."""
        raise NotImplementedError("Part B: PagedKVCache.allocate: register an empty block table")

    def free(self, seq_id) -> None:
        """End ``seq_id``: its blocks go back to the pool. ValueError if it is not live."""
        raise NotImplementedError("Part B: PagedKVCache.free: return the sequence's blocks to the pool")

    def seq_len(self, seq_id) -> int:
        """Positions stored for ``seq_id``. ValueError if it is not live."""
        raise NotImplementedError("Part B: PagedKVCache.seq_len")

    def block_table(self, seq_id) -> list[int]:
        """A copy of ``seq_id``'s physical block ids in logical order. ValueError if not live."""
        raise NotImplementedError("Part B: PagedKVCache.block_table")

    def update(self, layer_idx: int, seq_id, k: torch.Tensor, v: torch.Tensor):
        """Append ``k, v: (Hkv, T, D)`` (one sequence, ``T >= 1``) at positions
        ``seq_len(seq_id) ..`` of layer ``layer_idx``; return ``(k_all, v_all)``:
        ``(Hkv, seq_len + T, D)``, the sequence's stored prefix in logical order (a
        gather, so copies are fine). Take blocks from the pool when a position needs one;
        ``seq_len(seq_id)`` advances by T after layer ``n_layers - 1`` (as ``KVCache``).
        Raises ValueError (``seq_id`` not live; bad ``layer_idx``; bad shape or device),
        RuntimeError (not enough free blocks: the message names ``num_blocks`` and nothing
        changes), TypeError (dtype differs from the cache's).
        """
        raise NotImplementedError("Part B: PagedKVCache.update: grow the block table from the pool as needed, "
                                  "scatter k/v into (block, slot), gather the prefix back")
