"""Lab 05 reference: a KV cache for a small Llama-style decoder.

One file, in dependency order:
  ModelConfig        the decoder's hyper-parameters
  RMSNorm            root-mean-square norm (Zhang & Sennrich 2019)
  RotaryEmbedding    RoPE at explicit positions (Su et al. 2021), rotate-half layout
  attend             masked softmax attention with grouped KV heads, empty rows -> zeros
  Attention          GQA self-attention that reads and writes a KVCache      (Part A)
  MLP, Block         SwiGLU feed-forward (Shazeer 2020), pre-norm residual block
  Transformer        embedding -> blocks -> norm -> lm_head
  KVCache            preallocated per-layer K/V storage                       (Part A)
  generate           greedy decoding with or without the cache                (Part A)
  PagedKVCache       block-table KV storage shared by many sequences          (Part B)

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
        all ``S + T`` keys. ``attention_mask: (B, S + T)``, 1 = real token, 0 = left
        padding, covering cached and new tokens.
        Positions: ``S + t`` for new token ``t`` without a mask; with a mask, the number
        of real tokens before it (``cumsum(mask) - 1``). Query ``i`` may attend key ``j``
        iff ``j <= i + S`` (bottom-right causal) and key ``j`` is not padding.
        """
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)     # (B, H, T, D)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)

        S = cache.seq_len if cache is not None else 0  # read before update: it advances after the last layer
        if attention_mask is None:
            positions = torch.arange(S, S + T, device=x.device).expand(B, T)  # (B, T)
        else:
            # left padding shifts each row: a token's position counts the real tokens before it
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, S:]  # (B, T)
        q, k = rope(q, positions), rope(k, positions)

        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, Hkv, S + T, D): views of the stored prefix

        i = torch.arange(T, device=x.device)[:, None]
        j = torch.arange(S + T, device=x.device)[None, :]
        allowed = (j <= i + S)[None, None]  # (1, 1, T, S+T), bottom-right aligned
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, :]  # (B, 1, T, S+T): padded keys off
        y = attend(q, k, v, allowed)  # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


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

def _positive(**kw):
    for name, value in kw.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


class KVCache:
    """Preallocated K/V storage for ``n_layers`` attention layers.

    Storage: ``k, v: (n_layers, batch_size, n_kv_heads, max_seq_len, head_dim)``,
    allocated once here; ``nbytes = 2 * n_layers * batch_size * n_kv_heads *
    max_seq_len * head_dim * element_size``. ``seq_len``: positions stored (an int).
    """

    def __init__(self, n_layers, batch_size, max_seq_len, n_kv_heads, head_dim,
                 dtype=torch.float32, device="cpu"):
        _positive(n_layers=n_layers, batch_size=batch_size, max_seq_len=max_seq_len,
                  n_kv_heads=n_kv_heads, head_dim=head_dim)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.n_layers, self.batch_size, self.max_seq_len = n_layers, batch_size, max_seq_len
        self.n_kv_heads, self.head_dim, self.dtype = n_kv_heads, head_dim, dtype
        shape = (n_layers, batch_size, n_kv_heads, max_seq_len, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.device = self.k.device
        self.nbytes = 2 * self.k.numel() * self.k.element_size()
        self.seq_len = 0

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v: (B, Hkv, T, D)`` at positions ``seq_len .. seq_len+T-1`` of layer
        ``layer_idx``; return views ``(B, Hkv, seq_len + T, D)`` of that layer's stored prefix.
        ``seq_len`` advances by T after layer ``n_layers - 1``. Raises ValueError (bad
        layer, shape, device, or past ``max_seq_len``: storage untouched), TypeError (dtype).
        """
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < self.n_layers:
            raise ValueError(f"layer_idx must be in [0, {self.n_layers}), got {layer_idx!r}")
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            want = (self.batch_size, self.n_kv_heads, "T>=1", self.head_dim)
            if t.dim() != 4 or t.shape[0] != self.batch_size or t.shape[1] != self.n_kv_heads \
                    or t.shape[3] != self.head_dim or t.shape[2] < 1:
                raise ValueError(f"{name} must be (B, Hkv, T, D) = {want}, got shape {tuple(t.shape)}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, the cache on {self.device}")
            if t.dtype != self.dtype:
                raise TypeError(f"{name} has dtype {t.dtype}, the cache {self.dtype}")
        if k.shape != v.shape:
            raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
        S, T = self.seq_len, k.shape[2]
        if S + T > self.max_seq_len:  # check before writing: an overflow changes nothing
            raise ValueError(f"KVCache overflow: {S} positions stored + {T} new > max_seq_len={self.max_seq_len}")
        self.k[layer_idx, :, :, S:S + T] = k
        self.v[layer_idx, :, :, S:S + T] = v
        if layer_idx == self.n_layers - 1:
            self.seq_len = S + T
        return self.k[layer_idx, :, :, :S + T], self.v[layer_idx, :, :, :S + T]

    def reset(self) -> None:
        """Empty the cache (``seq_len = 0``); the storage is kept."""
        self.seq_len = 0


# --- Part A: generate ----------------------------------------------------------------

def _check_prompt(input_ids, max_new_tokens, attention_mask):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.int64:
        raise TypeError(f"input_ids must be an int64 tensor, got "
                        f"{getattr(input_ids, 'dtype', type(input_ids).__name__)}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be (B, L) with L >= 1, got shape {tuple(input_ids.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if attention_mask is None:
        return None
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    mask = attention_mask.long()
    if ((mask != 0) & (mask != 1)).any():
        raise ValueError("attention_mask must hold only 0 and 1")
    if (mask[:, 1:] < mask[:, :-1]).any() or (mask[:, -1] != 1).any():
        raise ValueError("attention_mask must be left padded: zeros, then at least one 1, per row")
    return mask


@torch.no_grad()
def generate(model, input_ids, max_new_tokens, attention_mask=None, use_cache=True):
    """Greedy decoding: ``(B, L)`` int64 -> ``(B, L + max_new_tokens)`` int64.

    With ``use_cache`` the prompt is run once (prefill) into a ``KVCache`` sized
    ``L + max_new_tokens``, then one token per step; without it, every step reruns
    the whole sequence. ``attention_mask (B, L)``: 0 = left padding. Raises
    ValueError when ``L + max_new_tokens > model.config.max_seq_len``.
    """
    mask = _check_prompt(input_ids, max_new_tokens, attention_mask)
    cfg = model.config
    B, L = input_ids.shape
    if L + max_new_tokens > cfg.max_seq_len:
        raise ValueError(f"prompt length {L} + max_new_tokens {max_new_tokens} exceeds max_seq_len={cfg.max_seq_len}")
    out = input_ids.clone()
    if max_new_tokens == 0:
        return out
    cache = None
    if use_cache:
        dtype = next(model.parameters()).dtype
        cache = KVCache(cfg.n_layers, B, L + max_new_tokens, cfg.n_kv_heads, cfg.head_dim,
                        dtype=dtype, device=input_ids.device)
    step_input = input_ids  # the whole prompt first (prefill), then one token at a time
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else out, cache=cache, attention_mask=mask)
        token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        out = torch.cat([out, token], dim=1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        step_input = token
    return out


# --- Part B (bonus): PagedKVCache ----------------------------------------------------------

class PagedKVCache:
    """K/V storage in fixed-size blocks shared by many sequences (vLLM's PagedAttention,
    Kwon et al. 2023).

    Storage: ``k_blocks, v_blocks: (n_layers, num_blocks, n_kv_heads, block_size, head_dim)``,
    allocated once; ``nbytes = 2 * n_layers * num_blocks * n_kv_heads * block_size *
    head_dim * element_size``. Each live sequence owns a block table (physical block ids
    in logical order); position ``p`` lives in block ``table[p // block_size]`` at slot
    ``p % block_size``. A sequence holds exactly ``ceil(seq_len / block_size)`` blocks.
    """

    def __init__(self, num_blocks, block_size, n_layers, n_kv_heads, head_dim,
                 dtype=torch.float32, device="cpu"):
        _positive(num_blocks=num_blocks, block_size=block_size, n_layers=n_layers,
                  n_kv_heads=n_kv_heads, head_dim=head_dim)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.num_blocks, self.block_size, self.n_layers = num_blocks, block_size, n_layers
        self.n_kv_heads, self.head_dim, self.dtype = n_kv_heads, head_dim, dtype
        shape = (n_layers, num_blocks, n_kv_heads, block_size, head_dim)
        self.k_blocks = torch.empty(shape, dtype=dtype, device=device)
        self.v_blocks = torch.empty(shape, dtype=dtype, device=device)
        self.device = self.k_blocks.device
        self.nbytes = 2 * self.k_blocks.numel() * self.k_blocks.element_size()
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() hands out the lowest id
        self._tables: dict = {}
        self._lens: dict = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def _get(self, seq_id):
        if seq_id not in self._tables:
            raise ValueError(f"seq_id {seq_id!r} is not allocated")
        return self._tables[seq_id]

    def allocate(self, seq_id) -> None:
        """Start an empty sequence (no blocks yet). ValueError if ``seq_id`` is live."""
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id!r} is already allocated")
        self._tables[seq_id], self._lens[seq_id] = [], 0

    def free(self, seq_id) -> None:
        """Return the sequence's blocks to the pool. ValueError if ``seq_id`` is not live."""
        table = self._get(seq_id)
        self._free.extend(reversed(table))
        del self._tables[seq_id], self._lens[seq_id]

    def seq_len(self, seq_id) -> int:
        """Positions stored for ``seq_id``."""
        self._get(seq_id)
        return self._lens[seq_id]

    def block_table(self, seq_id) -> list[int]:
        """A copy of the sequence's physical block ids, in logical order."""
        return list(self._get(seq_id))

    def update(self, layer_idx: int, seq_id, k: torch.Tensor, v: torch.Tensor):
        """Append ``k, v: (Hkv, T, D)`` to ``seq_id`` in layer ``layer_idx``; return
        ``(k_all, v_all): (Hkv, seq_len + T, D)``, the sequence's stored prefix.
        Blocks are taken from the pool when a position needs one; ``seq_len(seq_id)``
        advances after layer ``n_layers - 1``. Raises ValueError (unknown seq_id, bad
        layer or shape or device), RuntimeError (not enough free blocks: nothing changes),
        TypeError (dtype).
        """
        table = self._get(seq_id)
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < self.n_layers:
            raise ValueError(f"layer_idx must be in [0, {self.n_layers}), got {layer_idx!r}")
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 3 or t.shape[0] != self.n_kv_heads or t.shape[2] != self.head_dim or t.shape[1] < 1:
                raise ValueError(f"{name} must be (Hkv, T, D) = ({self.n_kv_heads}, T>=1, {self.head_dim}), "
                                 f"got shape {tuple(t.shape)}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, the cache on {self.device}")
            if t.dtype != self.dtype:
                raise TypeError(f"{name} has dtype {t.dtype}, the cache {self.dtype}")
        if k.shape != v.shape:
            raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
        S, T = self._lens[seq_id], k.shape[1]
        need = -(-(S + T) // self.block_size) - len(table)  # ceil((S+T)/block_size) blocks in all
        if need > len(self._free):
            raise RuntimeError(f"out of KV blocks: seq_id {seq_id!r} needs {need} more, {len(self._free)} "
                             f"of num_blocks={self.num_blocks} are free")
        for _ in range(max(need, 0)):
            table.append(self._free.pop())
        pos = torch.arange(S + T, device=self.device)  # logical positions 0 .. S+T-1
        blocks = torch.tensor(table, dtype=torch.long, device=self.device)[pos // self.block_size]
        slots = pos % self.block_size
        # advanced indices around a slice put the indexed dim first: (S+T, Hkv, D)
        self.k_blocks[layer_idx, blocks[S:], :, slots[S:]] = k.transpose(0, 1)
        self.v_blocks[layer_idx, blocks[S:], :, slots[S:]] = v.transpose(0, 1)
        if layer_idx == self.n_layers - 1:
            self._lens[seq_id] = S + T
        k_all = self.k_blocks[layer_idx, blocks, :, slots].transpose(0, 1)  # (Hkv, S+T, D)
        v_all = self.v_blocks[layer_idx, blocks, :, slots].transpose(0, 1)
        return k_all, v_all
