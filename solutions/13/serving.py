"""Lab 13: LLM serving, continuous batching over a paged KV cache -- the reference solution
(staff only, never released).

Many greedy-decoding requests share one model: a pool of fixed-size K/V blocks handed out
through per-sequence block tables with reference counts and a prefix cache of full blocks
(vLLM's PagedAttention, Kwon et al. SOSP 2023), an iteration-level scheduler that admits,
decodes, retires and preempts requests every step (Orca, Yu et al. OSDI 2022; vLLM V1's
scheduler), and the engine loop over a tiny float64 decoder.

Parts
  A  ``BlockManager``: block ids, the free queue in eviction order, the prefix cache.
  B  ``Scheduler``: one step's batch (decode first, then admission), preemption by
     recomputation of the newest request, ``postprocess``.
  C  ``build_model_inputs`` and ``LLMEngine`` (``add_request``, ``step``, ``generate``).

Given (finished, identical in the stub): ``ModelConfig``, ``ModelInputs``, ``TinyLM``,
``reference_generate``, ``static_generate``, ``Sequence``, ``NoFreeBlocksError``.

Shapes: N tokens in one forward, S sequences in it, W the widest block table, B the
block size (positions per block), V the vocabulary.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn as nn


# --- The model and the request (given) ----------------------------------------------------------

@dataclass
class ModelConfig:
    """Hyper-parameters of ``TinyLM``. ``head_dim = d_model // n_heads``."""

    vocab_size: int = 64       # V
    d_model: int = 32          # residual width
    n_layers: int = 2
    n_heads: int = 4           # query heads
    n_kv_heads: int = 2        # K/V heads (GQA: n_heads % n_kv_heads == 0)
    ffn_hidden: int = 64       # SwiGLU hidden width
    max_seq_len: int = 256     # positions 0 .. max_seq_len-1
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig: {name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"ModelConfig: need d_model % n_heads == 0, n_heads % n_kv_heads == 0 and an even "
                             f"head_dim, got d_model={self.d_model}, n_heads={self.n_heads}, "
                             f"n_kv_heads={self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class ModelInputs(NamedTuple):
    """One forward's metadata, six int64 tensors (vLLM's flattened layout: no padding of tokens).

    ``input_ids (N,)``        the tokens computed in this forward, sequence after sequence;
    ``positions (N,)``        each token's position in its sequence;
    ``slot_mapping (N,)``     where each token's K/V is written: ``block_id * B + offset``;
    ``query_start_loc (S+1,)`` running totals: sequence s owns tokens ``[qsl[s], qsl[s+1])``;
    ``context_lens (S,)``     positions of sequence s whose K/V exists after this forward;
    ``block_tables (S, W)``   each sequence's physical blocks in logical order, padded with -1.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE (GPT-NeoX / Llama layout): channel pairs ``(i, i + D/2)`` of ``x (N, heads, D)``
    rotate by ``positions[n] * theta ** (-2i / D)``; angles in float64."""
    D = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)  # (D/2,)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]                          # (N, D/2)
    cos, sin = ang.cos().to(x.dtype)[:, None], ang.sin().to(x.dtype)[:, None]                # (N, 1, D/2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class TinyLM(nn.Module):
    """A Llama-style decoder (RMSNorm, rotate-half RoPE, GQA, SwiGLU, untied head) whose weights are
    drawn from ``seed``: embeddings ~ N(0, 1), linear weights ~ N(0, 1/fan_in), norm weights
    1 + N(0, 0.1^2). Parameters are frozen: this model only serves.

    ``forward(inputs, kv_cache)`` is the paged path the engine calls (see its docstring);
    ``forward_dense(token_ids)`` the same function without a cache (``reference_generate``'s).
    """

    def __init__(self, config: ModelConfig | None = None, seed: int = 0, dtype=torch.float64, device="cpu"):
        super().__init__()
        self.config = cfg = config if config is not None else ModelConfig()
        g = torch.Generator().manual_seed(int(seed))
        H, Hkv, D, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model

        def linear(out_f, in_f):
            return nn.Parameter(torch.randn(out_f, in_f, generator=g, dtype=torch.float64) / math.sqrt(in_f))

        def norm():
            return nn.Parameter(1 + 0.1 * torch.randn(d, generator=g, dtype=torch.float64))

        self.tok_emb = nn.Parameter(torch.randn(cfg.vocab_size, d, generator=g, dtype=torch.float64))
        self.layers = nn.ModuleList()
        for _ in range(cfg.n_layers):
            layer = nn.Module()
            layer.attn_norm, layer.wq, layer.wk, layer.wv = norm(), linear(H * D, d), linear(Hkv * D, d), linear(Hkv * D, d)
            layer.wo = linear(d, H * D)
            layer.mlp_norm, layer.w1, layer.w3, layer.w2 = norm(), linear(cfg.ffn_hidden, d), linear(cfg.ffn_hidden, d), \
                linear(d, cfg.ffn_hidden)
            self.layers.append(layer)
        self.norm = norm()
        self.lm_head = linear(cfg.vocab_size, d)
        self.requires_grad_(False)
        self.to(device=device, dtype=dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_emb.dtype

    @property
    def device(self) -> torch.device:
        return self.tok_emb.device

    def new_kv_cache(self, num_blocks: int, block_size: int) -> torch.Tensor:
        """A zeroed K/V pool ``(n_layers, 2, num_blocks, block_size, n_kv_heads, head_dim)`` of the
        model's dtype and device; K at index 0 of dim 1, V at 1."""
        cfg = self.config
        return torch.zeros(cfg.n_layers, 2, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim,
                           dtype=self.dtype, device=self.device)

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.norm_eps) * w

    def _mlp(self, layer, x):
        h = self._rms(x, layer.mlp_norm)
        return x + (nn.functional.silu(h @ layer.w1.T) * (h @ layer.w3.T)) @ layer.w2.T

    def _check(self, inputs, kv_cache) -> tuple[int, int]:
        """ValueError for malformed inputs (see ``forward``); returns ``(num_blocks, block_size)``."""
        cfg = self.config
        if not isinstance(inputs, tuple) or len(inputs) != 6:
            raise ValueError(f"inputs must be a ModelInputs of six tensors, got {type(inputs).__name__}")
        names = ModelInputs._fields
        for name, t in zip(names, inputs):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
                raise ValueError(f"inputs.{name} must be an int64 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        ids, pos, slots, qsl, ctx, tables = (t.cpu() for t in inputs)
        want = (cfg.n_layers, 2, None, None, cfg.n_kv_heads, cfg.head_dim)
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 6 or \
                any(w is not None and s != w for s, w in zip(kv_cache.shape, want)):
            raise ValueError(f"kv_cache must be (n_layers, 2, num_blocks, block_size, n_kv_heads, head_dim) = "
                             f"{want}, got {tuple(getattr(kv_cache, 'shape', ()))}")
        if kv_cache.dtype != self.dtype or kv_cache.device != self.device:
            raise ValueError(f"kv_cache must be {self.dtype} on {self.device}, got {kv_cache.dtype} on {kv_cache.device}")
        num_blocks, B = kv_cache.shape[2], kv_cache.shape[3]
        N = ids.shape[0] if ids.dim() == 1 else -1
        S = ctx.shape[0] if ctx.dim() == 1 else -1
        if N < 1 or S < 1 or pos.shape != (N,) or slots.shape != (N,) or qsl.shape != (S + 1,) \
                or tables.dim() != 2 or tables.shape[0] != S:
            raise ValueError(f"inconsistent shapes: input_ids {tuple(ids.shape)}, positions {tuple(pos.shape)}, "
                             f"slot_mapping {tuple(slots.shape)}, query_start_loc {tuple(qsl.shape)}, context_lens "
                             f"{tuple(ctx.shape)}, block_tables {tuple(tables.shape)} (want (N,), (N,), (N,), "
                             f"(S+1,), (S,), (S, W) with N, S >= 1)")
        if int(qsl[0]) != 0 or int(qsl[-1]) != N or bool((qsl[1:] <= qsl[:-1]).any()):
            raise ValueError(f"query_start_loc must start at 0, end at N={N} and give every sequence a token, "
                             f"got {qsl.tolist()}")
        for name, t, hi in (("input_ids", ids, cfg.vocab_size), ("positions", pos, cfg.max_seq_len),
                            ("slot_mapping", slots, num_blocks * B), ("context_lens", ctx, cfg.max_seq_len + 1)):
            if bool((t < (1 if name == "context_lens" else 0)).any()) or bool((t >= hi).any()):
                raise ValueError(f"inputs.{name} outside its range [0, {hi}): {t.tolist()}")
        if bool((tables < -1).any()) or bool((tables >= num_blocks).any()):
            raise ValueError(f"a block id outside [0, num_blocks={num_blocks}) in block_tables {tables.tolist()}")
        for s in range(S):
            need = -(-int(ctx[s]) // B)
            if need > tables.shape[1] or bool((tables[s, :need] < 0).any()):
                raise ValueError(f"sequence {s} of the batch needs {need} blocks for context_lens={int(ctx[s])} "
                                 f"(block_size={B}), its table row is {tables[s].tolist()}")
        return num_blocks, B

    @torch.no_grad()
    def forward(self, inputs: ModelInputs, kv_cache: torch.Tensor) -> torch.Tensor:
        """The paged forward: writes the K/V of every input token (all layers) at ``slot_mapping``,
        then token n of sequence s at position p attends to positions ``j < context_lens[s]`` with
        ``j <= p``, key j read from slot ``block_tables[s, j // B] * B + j % B``. Returns the logits
        ``(S, V)`` of each sequence's LAST input token. Inputs may be on the CPU. ValueError for
        malformed inputs; consistent metadata is the caller's job (a wrong slot or position gives
        wrong logits, not an error)."""
        cfg = self.config
        num_blocks, B = self._check(inputs, kv_cache)
        ids, pos, slots, qsl, ctx, tables = (t.to(self.device) for t in inputs)
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        N, S = ids.shape[0], ctx.shape[0]
        seg = torch.repeat_interleave(torch.arange(S, device=self.device), qsl[1:] - qsl[:-1])  # (N,) sequence of token
        C = int(ctx.max())
        j = torch.arange(C, device=self.device)                                                 # (C,)
        blocks = tables.clamp(min=0).gather(1, (j // B).clamp(max=tables.shape[1] - 1).expand(S, C))  # (S, C)
        key_slots = blocks * B + j % B                                                          # (S, C)
        allowed = (j[None, :] < ctx[seg][:, None]) & (j[None, :] <= pos[:, None])                # (N, C)
        x = self.tok_emb[ids]                                                                   # (N, d)
        for li, layer in enumerate(self.layers):
            h = self._rms(x, layer.attn_norm)
            q = _rope((h @ layer.wq.T).view(N, H, D), pos, cfg.rope_theta)
            k = _rope((h @ layer.wk.T).view(N, Hkv, D), pos, cfg.rope_theta)
            v = (h @ layer.wv.T).view(N, Hkv, D)
            pool_k = kv_cache[li, 0].view(num_blocks * B, Hkv, D)
            pool_v = kv_cache[li, 1].view(num_blocks * B, Hkv, D)
            pool_k[slots] = k
            pool_v[slots] = v
            keys = pool_k[key_slots[seg]].repeat_interleave(H // Hkv, dim=2)                    # (N, C, H, D)
            vals = pool_v[key_slots[seg]].repeat_interleave(H // Hkv, dim=2)
            scores = torch.einsum("nhd,nchd->nhc", q, keys) / math.sqrt(D)                      # (N, H, C)
            scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
            att = torch.einsum("nhc,nchd->nhd", scores.softmax(-1), vals)                       # (N, H, D)
            x = x + att.reshape(N, H * D) @ layer.wo.T
            x = self._mlp(layer, x)
        last = x[qsl[1:] - 1]                                                                   # (S, d)
        return self._rms(last, self.norm) @ self.lm_head.T                                      # (S, V)

    @torch.no_grad()
    def forward_dense(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The same model without a cache: ``token_ids (L,)`` at positions ``0..L-1``, causal;
        returns ``(L, V)`` logits."""
        cfg = self.config
        ids = torch.as_tensor(token_ids, dtype=torch.int64, device=self.device)
        if ids.dim() != 1 or ids.numel() < 1 or ids.numel() > cfg.max_seq_len:
            raise ValueError(f"token_ids must be (L,) with 1 <= L <= max_seq_len={cfg.max_seq_len}, "
                             f"got shape {tuple(ids.shape)}")
        H, Hkv, D, L = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, ids.shape[0]
        pos = torch.arange(L, device=self.device)
        causal = torch.ones(L, L, dtype=torch.bool, device=self.device).tril()
        x = self.tok_emb[ids]
        for layer in self.layers:
            h = self._rms(x, layer.attn_norm)
            q = _rope((h @ layer.wq.T).view(L, H, D), pos, cfg.rope_theta).transpose(0, 1)          # (H, L, D)
            k = _rope((h @ layer.wk.T).view(L, Hkv, D), pos, cfg.rope_theta).transpose(0, 1)
            v = (h @ layer.wv.T).view(L, Hkv, D).transpose(0, 1)
            k, v = k.repeat_interleave(H // Hkv, dim=0), v.repeat_interleave(H // Hkv, dim=0)        # (H, L, D)
            scores = (q @ k.transpose(1, 2) / math.sqrt(D)).masked_fill(~causal, float("-inf"))
            x = x + (scores.softmax(-1) @ v).transpose(0, 1).reshape(L, H * D) @ layer.wo.T
            x = self._mlp(layer, x)
        return self._rms(x, self.norm) @ self.lm_head.T


def reference_generate(model: TinyLM, prompt, max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """Greedy decoding of one prompt alone with ``model.forward_dense`` (recomputing everything each
    step): stops after the EOS token (kept) or ``max_new_tokens`` tokens. The oracle of this lab."""
    tokens, out = list(prompt), []
    while len(out) < max_new_tokens:
        tok = int(model.forward_dense(torch.tensor(tokens))[-1].argmax())
        out.append(tok)
        tokens.append(tok)
        if eos_token_id is not None and tok == eos_token_id:
            break
    return out


def static_generate(model: TinyLM, prompts, max_new_tokens, eos_token_id: int | None = None, batch_size: int = 8,
                    block_size: int = 16) -> list[list[int]]:
    """The static-batching baseline: requests in groups of ``batch_size`` in order; a group is
    prefilled in one forward, then decoded (its unfinished requests, one token each per forward)
    until all of them are done; no request joins a running group. ``max_new_tokens``: an int or
    one per prompt. Each request gets contiguous blocks of a pool made for its group."""
    prompts = [list(p) for p in prompts]
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    outputs: list[list[int]] = [[] for _ in prompts]
    B = block_size
    for g0 in range(0, len(prompts), batch_size):
        group = list(range(g0, min(g0 + batch_size, len(prompts))))
        need = [-(-(len(prompts[i]) + limits[i]) // B) for i in group]
        kv_cache = model.new_kv_cache(sum(need), B)
        tables, first = {}, 0
        for i, n in zip(group, need):
            tables[i], first = list(range(first, first + n)), first + n
        live, computed = list(group), {i: 0 for i in group}
        while live:
            ids, pos, slots, qsl, ctx = [], [], [], [0], []
            for i in live:
                t = prompts[i] + outputs[i]
                new = t[computed[i]:]
                for p in range(computed[i], len(t)):
                    pos.append(p)
                    slots.append(tables[i][p // B] * B + p % B)
                ids += new
                qsl.append(qsl[-1] + len(new))
                ctx.append(len(t))
            W = max(len(tables[i]) for i in live)
            rows = [tables[i] + [-1] * (W - len(tables[i])) for i in live]
            inputs = ModelInputs(*(torch.tensor(x, dtype=torch.int64) for x in (ids, pos, slots, qsl, ctx, rows)))
            tokens = model(inputs, kv_cache).argmax(dim=-1).tolist()
            for i, tok in zip(list(live), tokens):
                computed[i] = len(prompts[i]) + len(outputs[i])
                outputs[i].append(tok)
                if (eos_token_id is not None and tok == eos_token_id) or len(outputs[i]) == limits[i]:
                    live.remove(i)
    return outputs


@dataclass(eq=False)
class Sequence:
    """One request. ``output``: the generated tokens; ``status``: ``"waiting"``, ``"running"`` or
    ``"finished"``; ``num_computed_tokens``: leading tokens whose K/V is in the pool (0 while
    waiting); ``num_scheduled_tokens``: tokens the current step computes. Compared by identity.
    TypeError / ValueError for a prompt that is not a non-empty list of ints >= 0, or
    ``max_new_tokens < 1``."""

    seq_id: int
    prompt: list
    max_new_tokens: int
    eos_token_id: int | None = None
    output: list = field(default_factory=list)
    status: str = "waiting"
    num_computed_tokens: int = 0
    num_scheduled_tokens: int = 0

    def __post_init__(self):
        if not isinstance(self.prompt, (list, tuple)) or \
                not all(isinstance(t, int) and not isinstance(t, bool) for t in self.prompt):
            raise TypeError(f"prompt must be a list of ints, got {self.prompt!r:.80}")
        if not self.prompt or min(self.prompt) < 0:
            raise ValueError(f"prompt must be a non-empty list of token ids >= 0, got {self.prompt!r:.80}")
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool):
            raise TypeError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.prompt = list(self.prompt)

    @property
    def token_ids(self) -> list:
        """``prompt + output`` (a new list)."""
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)


class NoFreeBlocksError(RuntimeError):
    """The block pool has no free block for an allocation (``allocate``, ``append_slot``)."""


# --- Part A: BlockManager -----------------------------------------------------------------------

def _check_size(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class BlockManager:
    """Hands out the ids of ``num_blocks`` blocks of ``block_size`` positions (it stores no K/V).

    The free queue holds the blocks whose reference count is 0 in eviction order: fresh blocks
    come from its head, blocks whose count drops to 0 join its tail, a cache hit on a free block
    takes it out wherever it is. The prefix cache maps the key of a FULL block (chained: it
    identifies every token from position 0 to the block's end) to the block holding it; an entry
    lives until its block is taken fresh from the queue (evicted).
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = _check_size("num_blocks", num_blocks)
        self.block_size = _check_size("block_size", block_size)
        self._ref = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # head first
        self._cache: dict[int, int] = {}         # key -> block id
        self._key_of: dict[int, int] = {}        # block id -> key (cached blocks)
        self._tables: dict[object, list[int]] = {}
        self._slots: dict[object, int] = {}
        self._offered: dict[object, int] = {}    # leading blocks of the table offered to the cache

    # -- helpers
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def _keys(self, token_ids, n_blocks: int) -> list[int]:
        """Chained keys of the first ``n_blocks`` full blocks: key_i = hash((key_{i-1}, block_i's tokens))."""
        B, keys, key = self.block_size, [], None
        for i in range(n_blocks):
            key = hash((key, tuple(token_ids[i * B:(i + 1) * B])))
            keys.append(key)
        return keys

    def _hits(self, token_ids) -> list[int]:
        """The cached blocks of the longest cached run of leading full blocks, at most (n - 1) // B."""
        hits = []
        for key in self._keys(token_ids, (len(token_ids) - 1) // self.block_size):
            block = self._cache.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def _take_fresh(self) -> int:
        block, _ = self._free.popitem(last=False)   # the head
        key = self._key_of.pop(block, None)
        if key is not None:                          # evicted: its entry goes
            del self._cache[key]
        self._ref[block] = 1
        return block

    def _table(self, seq_id) -> list[int]:
        if seq_id not in self._tables:
            raise ValueError(f"unknown seq_id {seq_id!r}: it has no blocks")
        return self._tables[seq_id]

    # -- allocation
    def cached_prefix_len(self, token_ids) -> int:
        return len(self._hits(token_ids)) * self.block_size

    def can_allocate(self, token_ids) -> bool:
        hits = self._hits(token_ids)
        in_use = sum(1 for b in hits if self._ref[b] > 0)
        return -(-len(token_ids) // self.block_size) - in_use <= self.num_free_blocks

    def allocate(self, seq_id, token_ids) -> int:
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id!r} already has blocks")
        if len(token_ids) == 0:
            raise ValueError("token_ids is empty: a sequence needs at least one token")
        if not self.can_allocate(token_ids):
            raise NoFreeBlocksError(f"no free blocks for seq_id {seq_id!r}: {len(token_ids)} tokens, "
                                    f"{self.num_free_blocks} free of num_blocks={self.num_blocks}")
        hits = self._hits(token_ids)
        for b in hits:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
        table = hits + [self._take_fresh() for _ in range(-(-len(token_ids) // self.block_size) - len(hits))]
        self._tables[seq_id], self._slots[seq_id], self._offered[seq_id] = table, len(token_ids), len(hits)
        return len(hits) * self.block_size

    def can_append(self, seq_id) -> bool:
        self._table(seq_id)
        return self._slots[seq_id] % self.block_size != 0 or self.num_free_blocks > 0

    def append_slot(self, seq_id) -> int:
        table, B = self._table(seq_id), self.block_size
        p = self._slots[seq_id]
        if p % B == 0:
            if not self._free:
                raise NoFreeBlocksError(f"no free block for position {p} of seq_id {seq_id!r} "
                                        f"(num_blocks={self.num_blocks})")
            table.append(self._take_fresh())
        self._slots[seq_id] = p + 1
        return table[p // B] * B + p % B

    def cache_full_blocks(self, seq_id, token_ids) -> None:
        table = self._table(seq_id)
        if len(token_ids) > self._slots[seq_id]:
            raise ValueError(f"cache_full_blocks: {len(token_ids)} tokens for seq_id {seq_id!r}, which has only "
                             f"{self._slots[seq_id]} slots")
        full = len(token_ids) // self.block_size
        done = self._offered[seq_id]
        if full <= done:
            return
        for i, key in enumerate(self._keys(token_ids, full)[done:], start=done):
            if key not in self._cache:       # first offered wins; a duplicate stays uncached
                self._cache[key] = table[i]
                self._key_of[table[i]] = key
        self._offered[seq_id] = full

    def free(self, seq_id) -> None:
        table = self._table(seq_id)
        for b in reversed(table):            # the last block first: it is the least likely to be shared
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None         # the tail
        del self._tables[seq_id], self._slots[seq_id], self._offered[seq_id]

    # -- observation
    def free_block_ids(self) -> list[int]:
        return list(self._free)

    def _block(self, block_id) -> int:
        if not isinstance(block_id, int) or isinstance(block_id, bool) or not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block_id {block_id!r} outside [0, num_blocks={self.num_blocks})")
        return block_id

    def ref_count(self, block_id) -> int:
        return self._ref[self._block(block_id)]

    def is_cached(self, block_id) -> bool:
        return self._block(block_id) in self._key_of

    def block_table(self, seq_id) -> list[int]:
        return list(self._table(seq_id))

    def num_slots(self, seq_id) -> int:
        self._table(seq_id)
        return self._slots[seq_id]


# --- Part B: Scheduler --------------------------------------------------------------------------

class Scheduler:
    """Iteration-level scheduling (Orca) with vLLM V1's step shape: decode every running sequence
    (oldest first, preempting the newest while a decode finds no block), then, if nobody was
    preempted, admit waiting requests in order while the token budget, ``max_num_seqs`` and the
    pool allow (head-of-line blocking: never skip)."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        if not isinstance(max_num_seqs, int) or isinstance(max_num_seqs, bool) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be an int >= 1, got {max_num_seqs!r}")
        if not isinstance(max_num_batched_tokens, int) or isinstance(max_num_batched_tokens, bool) \
                or max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens must be an int >= max_num_seqs={max_num_seqs}, "
                             f"got {max_num_batched_tokens!r}")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        K = len(seq.prompt) + seq.max_new_tokens - 1  # K/V slots it can need: the last token is never fed back
        if K > self.max_num_batched_tokens:
            raise ValueError(f"request {seq.seq_id} can need {K} tokens in one step (prompt {len(seq.prompt)} + "
                             f"max_new_tokens {seq.max_new_tokens} - 1) > max_num_batched_tokens="
                             f"{self.max_num_batched_tokens} (no chunked prefill)")
        blocks = -(-K // self.block_manager.block_size)
        if blocks > self.block_manager.num_blocks:
            raise ValueError(f"request {seq.seq_id} can need {blocks} blocks > num_blocks="
                             f"{self.block_manager.num_blocks}")
        seq.status = "waiting"
        self.waiting.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recomputation: the blocks go, the output stays, the request goes first in line."""
        self.block_manager.free(seq.seq_id)
        seq.status = "waiting"
        seq.num_computed_tokens = 0
        seq.num_scheduled_tokens = 0
        self.waiting.appendleft(seq)

    def schedule(self) -> list[Sequence]:
        bm = self.block_manager
        batch: list[Sequence] = []
        preempted = False
        i = 0
        while i < len(self.running):                     # 1. decode, oldest first
            seq = self.running[i]
            while not bm.can_append(seq.seq_id):
                victim = self.running.pop()              # the most recently admitted
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status != "running":                  # it preempted itself: the decode phase ends
                break
            bm.append_slot(seq.seq_id)
            seq.num_scheduled_tokens = 1
            batch.append(seq)
            i += 1
        if not preempted:                                # 2. admission, only in a step that preempted nobody
            budget = self.max_num_batched_tokens - len(batch)
            while self.waiting and len(self.running) < self.max_num_seqs:
                seq = self.waiting[0]
                t = seq.token_ids
                new = len(t) - bm.cached_prefix_len(t)
                if new > budget or not bm.can_allocate(t):
                    break                                # head-of-line blocking
                cached = bm.allocate(seq.seq_id, t)
                self.waiting.popleft()
                self.running.append(seq)
                seq.status = "running"
                seq.num_computed_tokens = cached
                seq.num_scheduled_tokens = new
                batch.append(seq)
                budget -= new
        return batch

    def postprocess(self, batch: list[Sequence], token_ids: list[int]) -> list[Sequence]:
        if len(token_ids) != len(batch):
            raise ValueError(f"postprocess: {len(token_ids)} token_ids for a batch of {len(batch)}")
        finished = []
        for seq, tok in zip(batch, token_ids):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.cache_full_blocks(seq.seq_id, seq.token_ids[:seq.num_computed_tokens])
            seq.output.append(int(tok))
            if (seq.eos_token_id is not None and tok == seq.eos_token_id) or len(seq.output) == seq.max_new_tokens:
                seq.status = "finished"
                self.block_manager.free(seq.seq_id)
                self.running.remove(seq)
                finished.append(seq)
        return finished

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)


# --- Part C: build_model_inputs and LLMEngine ---------------------------------------------------

def build_model_inputs(batch: list[Sequence], block_tables: list[list[int]], block_size: int) -> ModelInputs:
    if not batch:
        raise ValueError("build_model_inputs: the batch is empty")
    if len(block_tables) != len(batch):
        raise ValueError(f"build_model_inputs: {len(block_tables)} block tables for a batch of {len(batch)}")
    B = block_size
    ids, pos, slots, qsl, ctx = [], [], [], [0], []
    for seq, table in zip(batch, block_tables):
        c, n = seq.num_computed_tokens, seq.num_scheduled_tokens
        if n < 1:
            raise ValueError(f"seq_id {seq.seq_id}: num_scheduled_tokens={n} < 1")
        if len(table) * B < c + n:
            raise ValueError(f"seq_id {seq.seq_id}: its table of {len(table)} blocks does not reach position "
                             f"{c + n - 1} (block_size={B})")
        ids += seq.token_ids[c:c + n]
        for p in range(c, c + n):
            pos.append(p)
            slots.append(table[p // B] * B + p % B)
        qsl.append(qsl[-1] + n)
        ctx.append(c + n)
    W = max(len(t) for t in block_tables)
    rows = [list(t) + [-1] * (W - len(t)) for t in block_tables]
    return ModelInputs(*(torch.tensor(x, dtype=torch.int64) for x in (ids, pos, slots, qsl, ctx, rows)))


class LLMEngine:
    """The serving loop: requests in, one ``schedule -> build_model_inputs -> model -> argmax ->
    postprocess`` per ``step()``, outputs out."""

    def __init__(self, model, num_blocks: int, block_size: int, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 256):
        self.model = model
        self.block_manager = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens)
        self.kv_cache = model.new_kv_cache(num_blocks, block_size)
        self.sequences: dict[int, Sequence] = {}
        self._next_id = 0

    def _check_request(self, prompt, max_new_tokens, eos_token_id) -> None:
        cfg = self.model.config
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in prompt):
            raise TypeError(f"prompt must be a list of ints, got {prompt!r:.80}")
        if not prompt:
            raise ValueError("prompt is empty")
        bad = [t for t in prompt if not 0 <= t < cfg.vocab_size]
        if bad:
            raise ValueError(f"prompt token {bad[0]} outside the vocabulary [0, vocab_size={cfg.vocab_size})")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if eos_token_id is not None and (not isinstance(eos_token_id, int) or not 0 <= eos_token_id < cfg.vocab_size):
            raise ValueError(f"eos_token_id {eos_token_id!r} outside the vocabulary [0, {cfg.vocab_size})")
        if len(prompt) + max_new_tokens > cfg.max_seq_len:
            raise ValueError(f"prompt of {len(prompt)} + max_new_tokens {max_new_tokens} > max_seq_len="
                             f"{cfg.max_seq_len}")
        K = len(prompt) + max_new_tokens - 1
        if K > self.scheduler.max_num_batched_tokens:
            raise ValueError(f"the request can need {K} tokens in one step > max_num_batched_tokens="
                             f"{self.scheduler.max_num_batched_tokens}")
        if -(-K // self.block_manager.block_size) > self.block_manager.num_blocks:
            raise ValueError(f"the request can need {-(-K // self.block_manager.block_size)} blocks > "
                             f"num_blocks={self.block_manager.num_blocks}")

    def add_request(self, prompt, max_new_tokens: int, eos_token_id: int | None = None) -> int:
        self._check_request(prompt, max_new_tokens, eos_token_id)
        seq = Sequence(self._next_id, list(prompt), max_new_tokens, eos_token_id)
        self.scheduler.add(seq)
        self.sequences[seq.seq_id] = seq
        self._next_id += 1
        return seq.seq_id

    def step(self) -> list[tuple[int, int]]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        tables = [self.block_manager.block_table(seq.seq_id) for seq in batch]
        inputs = build_model_inputs(batch, tables, self.block_manager.block_size)
        logits = self.model(inputs, self.kv_cache)                  # (S, V), one call for the whole batch
        tokens = logits.argmax(dim=-1).tolist()                     # ties: the lowest token id
        self.scheduler.postprocess(batch, tokens)
        return [(seq.seq_id, tok) for seq, tok in zip(batch, tokens)]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def generate(self, prompts, max_new_tokens, eos_token_id: int | None = None) -> list[list[int]]:
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) and \
            not isinstance(max_new_tokens, bool) else list(max_new_tokens)
        if len(limits) != len(prompts):
            raise ValueError(f"max_new_tokens: {len(limits)} limits for {len(prompts)} prompts")
        for prompt, limit in zip(prompts, limits):                  # every request first: all or none
            self._check_request(prompt, limit, eos_token_id)
        ids = [self.add_request(p, n, eos_token_id) for p, n in zip(prompts, limits)]
        while self.has_unfinished():
            self.step()
        return [list(self.sequences[i].output) for i in ids]
