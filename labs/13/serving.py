"""Lab 13: LLM serving, continuous batching over a paged KV cache.

What you build
  Part A  ``BlockManager``: hands out the ids of fixed-size K/V blocks through per-sequence
          block tables with reference counts, a free queue in eviction order and a prefix
          cache of full blocks (vLLM's PagedAttention block manager).
  Part B  ``Scheduler``: every step, decode the running requests (oldest first, preempting
          the newest by recomputation when the pool runs dry), then admit waiting requests
          into the remaining token budget (iteration-level scheduling, Orca / vLLM V1).
  Part C  ``build_model_inputs`` (one forward's six metadata tensors) and ``LLMEngine``
          (``add_request``, ``step``, ``generate``): the serving loop over ``TinyLM``.

Test as you go:  ``pytest labs/13`` (visible tests), ``pytest labs/13 -k block_manager``
(Part A), ``-k scheduler`` (Part B), ``-k "inputs or engine"`` (Part C),
``labs grade . --lab 13`` (self-grade with the hidden graders, where installed).
Everything runs on CPU, in float64.

Given (finished; the graders use them as they are): ``ModelConfig``, ``ModelInputs``,
``TinyLM`` (the model the engine serves: ``forward(inputs, kv_cache)`` is the paged path),
``reference_generate`` (greedy decoding of one prompt alone: the oracle),
``static_generate`` (the static-batching baseline), ``Sequence`` (one request) and
``NoFreeBlocksError``. Your work: ``BlockManager``, ``Scheduler``, ``build_model_inputs``
and ``LLMEngine``.

Shapes: N tokens in one forward, S sequences in it, W the widest block table, B the
block size (positions per block), V the vocabulary.
"""
from __future__ import annotations

import math
from collections import deque
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

class BlockManager:
    """Hands out the ids of ``num_blocks`` blocks of ``block_size`` positions; it stores no K/V.

    ``BlockManager(num_blocks, block_size)``: ints >= 1, else ValueError naming the argument.
    Attributes ``num_blocks``, ``block_size`` (B below).

    Free queue: the blocks whose reference count is 0, in eviction order, head first;
    initially ``[0, 1, ..., num_blocks - 1]``. A *fresh* block is always taken from the head
    (its count becomes 1; if it is cached, its entry is removed: *evicted*). A block whose
    count drops to 0 is appended at the tail. A cache hit on a block with count 0 removes it
    from the queue wherever it is. Nothing else reorders the queue.

    Prefix cache: a map from the keys of FULL blocks to block ids. The key of block i of a
    token list identifies all its tokens ``[0, (i+1)*B)``: chain it,
    ``key_i = hash((key_{i-1}, tuple(tokens of block i)))``. A block is cached iff it is the
    value of an entry. Entries are added only by ``cache_full_blocks`` and removed only by
    eviction. Hits of a token list of length n: the longest run of leading blocks 0, 1, ...
    whose keys are cached, at most ``(n - 1) // B`` blocks (the last token is always computed).

    Every per-sequence method raises ValueError naming the id for an unknown ``seq_id``; a
    block id outside ``[0, num_blocks)`` raises ValueError. A raising call changes nothing.
    """

    def __init__(self, num_blocks: int, block_size: int):
        raise NotImplementedError("Part A: BlockManager.__init__: check the sizes; free queue [0, ..., num_blocks-1], "
                                  "reference counts 0, an empty prefix cache, no tables")

    @property
    def num_free_blocks(self) -> int:
        """The length of the free queue."""
        raise NotImplementedError("Part A: BlockManager.num_free_blocks")

    def cached_prefix_len(self, token_ids) -> int:
        """hits x B for ``token_ids`` (see the class docstring). No state change."""
        raise NotImplementedError("Part A: BlockManager.cached_prefix_len: the longest cached run of leading full "
                                  "blocks (chained keys), at most (n - 1) // B blocks, times B")

    def can_allocate(self, token_ids) -> bool:
        """``ceil(n / B) - (hits whose count is > 0) <= num_free_blocks`` (a hit on a free block
        uses one of the free blocks). No state change."""
        raise NotImplementedError("Part A: BlockManager.can_allocate")

    def allocate(self, seq_id, token_ids) -> int:
        """Reserve slots for the n tokens of a new sequence: its table is the hit blocks (each
        count + 1, those at 0 leaving the queue), then ``ceil(n / B) - hits`` fresh blocks taken
        one by one from the head. Returns hits x B (the cached tokens).
        Raises NoFreeBlocksError when ``can_allocate`` is False; ValueError when ``seq_id``
        already has blocks or ``token_ids`` is empty."""
        raise NotImplementedError("Part A: BlockManager.allocate: hits first (out of the free queue), then fresh "
                                  "blocks from the head; return the cached tokens")

    def can_append(self, seq_id) -> bool:
        """Whether ``append_slot`` can reserve the next position: True unless it needs a fresh
        block (``num_slots % B == 0``) and none is free."""
        raise NotImplementedError("Part A: BlockManager.can_append")

    def append_slot(self, seq_id) -> int:
        """Reserve position ``p = num_slots(seq_id)``: if ``p % B == 0`` append a fresh block to the
        table (none free: NoFreeBlocksError, nothing changed). Returns the slot
        ``table[p // B] * B + p % B``."""
        raise NotImplementedError("Part A: BlockManager.append_slot: a fresh block when p % B == 0; "
                                  "return table[p // B] * B + p % B")

    def cache_full_blocks(self, seq_id, token_ids) -> None:
        """``token_ids``: the sequence's tokens at positions ``0 .. len-1`` whose K/V is now in the
        pool (``len <= num_slots(seq_id)``, else ValueError). Each full block ``i < len // B`` not
        yet offered since ``allocate`` is offered once, in order: its key becomes an entry for
        it unless the key has one already (then the existing entry stays and this block is
        not cached). Hit blocks count as offered."""
        raise NotImplementedError("Part A: BlockManager.cache_full_blocks: offer each new full block once; the "
                                  "first block offered for a key keeps the entry")

    def free(self, seq_id) -> None:
        """Decrement the counts of the table's blocks in REVERSE table order (last block first),
        appending each that reaches 0 to the queue tail; the sequence has no blocks afterwards.
        Entries are kept."""
        raise NotImplementedError("Part A: BlockManager.free: counts down, last block first; zeros join the tail")

    def free_block_ids(self) -> list[int]:
        """The free queue, head first (a new list)."""
        raise NotImplementedError("Part A: BlockManager.free_block_ids")

    def ref_count(self, block_id) -> int:
        """Live tables holding ``block_id``."""
        raise NotImplementedError("Part A: BlockManager.ref_count")

    def is_cached(self, block_id) -> bool:
        """Whether ``block_id`` is the value of a prefix-cache entry."""
        raise NotImplementedError("Part A: BlockManager.is_cached")

    def block_table(self, seq_id) -> list[int]:
        """A copy of the sequence's block ids in logical order."""
        raise NotImplementedError("Part A: BlockManager.block_table")

    def num_slots(self, seq_id) -> int:
        """Positions reserved for the sequence (``allocate``'s n plus one per ``append_slot``)."""
        raise NotImplementedError("Part A: BlockManager.num_slots")


# --- Part B: Scheduler --------------------------------------------------------------------------

class Scheduler:
    """One engine step's batch: decode, preemption by recomputation, admission.

    ``Scheduler(block_manager, max_num_seqs, max_num_batched_tokens)``: ValueError naming
    ``max_num_seqs`` if < 1, ``max_num_batched_tokens`` if < ``max_num_seqs``. Attributes
    ``block_manager``, ``max_num_seqs``, ``max_num_batched_tokens``, ``waiting`` (a
    ``collections.deque`` of Sequences, front first) and ``running`` (a list, oldest admission
    first). Use only the BlockManager methods of Part A (the graders may hand you another
    BlockManager), change the pool only through ``allocate``, ``append_slot``,
    ``cache_full_blocks`` and ``free``, and allocate only a request you admit.
    """

    def __init__(self, block_manager, max_num_seqs: int, max_num_batched_tokens: int):
        raise NotImplementedError("Part B: Scheduler.__init__: check the limits; waiting = deque(), running = []")

    def add(self, seq: Sequence) -> None:
        """Append a new waiting Sequence at the back of ``waiting``. It can need
        ``K = len(prompt) + max_new_tokens - 1`` K/V slots: ValueError naming
        ``max_num_batched_tokens`` if ``K > max_num_batched_tokens`` (no chunked prefill), naming
        ``num_blocks`` if ``ceil(K / B) > num_blocks``; equality is accepted; a rejected ``add``
        changes nothing."""
        raise NotImplementedError("Part B: Scheduler.add: refuse a request that could never run; append to waiting")

    def schedule(self) -> list[Sequence]:
        """One step.

        1. Decode: for each running sequence, oldest first: while ``can_append`` is False,
           preempt the LAST sequence of ``running`` (possibly this one): ``free`` its blocks,
           ``status = "waiting"``, ``num_computed_tokens = 0``, output kept, put it at the
           FRONT of ``waiting``; if it was this sequence, stop the decode phase. Otherwise
           ``append_slot``, ``num_scheduled_tokens = 1``, add it to the batch.
        2. Admission, only if step 1 preempted nobody: while ``waiting`` is non-empty and
           ``len(running) < max_num_seqs``: for the front sequence, ``t = token_ids``,
           ``new = len(t) - cached_prefix_len(t)``; stop (never skip to a later request) if
           decode tokens + admitted new tokens + new > ``max_num_batched_tokens`` or not
           ``can_allocate(t)``; else ``allocate``, move it to the back of ``running``,
           ``status = "running"``, ``num_computed_tokens`` = the cached tokens,
           ``num_scheduled_tokens = new``, add it to the batch.
        Returns the batch (the decoding sequences, then the admitted ones); ``[]`` when there
        is nothing to run."""
        raise NotImplementedError("Part B: Scheduler.schedule: decode (preempting the newest when a block is "
                                  "missing), then admit in order into the token budget if nobody was preempted")

    def postprocess(self, batch: list[Sequence], token_ids: list[int]) -> list[Sequence]:
        """For each sequence of the batch, in order, with its token: ``num_computed_tokens +=
        num_scheduled_tokens``, ``num_scheduled_tokens = 0``, ``cache_full_blocks(seq_id,
        token_ids[:num_computed_tokens])``, append the token to ``output``; if it equals
        ``eos_token_id`` (not None) or ``len(output) == max_new_tokens``: ``status =
        "finished"``, free its blocks, remove it from ``running``. Returns the finished
        sequences in batch order. ValueError if ``len(token_ids) != len(batch)``."""
        raise NotImplementedError("Part B: Scheduler.postprocess: advance, cache full blocks, append the token, "
                                  "retire finished sequences at once")

    def has_unfinished(self) -> bool:
        """Any waiting or running sequence."""
        raise NotImplementedError("Part B: Scheduler.has_unfinished")


# --- Part C: build_model_inputs and LLMEngine ---------------------------------------------------

def build_model_inputs(batch: list[Sequence], block_tables: list[list[int]], block_size: int) -> ModelInputs:
    """The six tensors of one forward. For each sequence of the batch in order, with
    ``c = num_computed_tokens``, ``n = num_scheduled_tokens`` and its table: tokens
    ``token_ids[c : c+n]`` at positions ``c .. c+n-1``, the slot of position p
    ``table[p // B] * B + p % B`` (the last, partial block included), ``query_start_loc`` the
    running totals from 0, ``context_lens = c + n``; ``block_tables`` the tables padded with -1
    to the longest one. int64 CPU tensors. ValueError for an empty batch,
    ``len(block_tables) != len(batch)``, ``n < 1``, or a table that does not reach position
    ``c + n - 1`` (naming the seq_id)."""
    raise NotImplementedError("Part C: build_model_inputs: flatten the batch's new tokens with their positions "
                              "and slots; query_start_loc, context_lens, tables padded with -1")


class LLMEngine:
    """The serving loop over ``model`` (a ``TinyLM``).

    ``LLMEngine(model, num_blocks, block_size, max_num_seqs=8, max_num_batched_tokens=256)``:
    attributes ``model``, ``block_manager`` (a ``BlockManager(num_blocks, block_size)``),
    ``scheduler`` (a ``Scheduler`` over it), ``kv_cache`` (from ``model.new_kv_cache(num_blocks,
    block_size)``, called exactly once, here), ``sequences`` (dict: seq_id -> Sequence, every
    request ever added). Never call ``model.forward_dense``, ``reference_generate`` or
    ``static_generate``, and compute logits only with ``model(inputs, kv_cache)``.
    """

    def __init__(self, model, num_blocks: int, block_size: int, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 256):
        raise NotImplementedError("Part C: LLMEngine.__init__: a BlockManager, a Scheduler over it, the K/V pool "
                                  "from model.new_kv_cache (once), sequences = {}")

    def add_request(self, prompt, max_new_tokens: int, eos_token_id: int | None = None) -> int:
        """Queue one request; returns its id (0, 1, 2, ... in call order). TypeError if ``prompt``
        is not a list (or tuple) of ints; ValueError for an empty prompt, a token outside
        ``[0, vocab_size)`` (naming it), ``max_new_tokens < 1``, an ``eos_token_id`` outside the
        vocabulary, ``len(prompt) + max_new_tokens > max_seq_len`` (naming ``max_seq_len``) and
        the ``Scheduler.add`` errors. A rejected request takes no id and changes nothing."""
        raise NotImplementedError("Part C: LLMEngine.add_request: validate, make a Sequence, scheduler.add")

    def step(self) -> list[tuple[int, int]]:
        """``schedule()``; an empty batch returns ``[]`` without calling the model. Else build the
        inputs from the batch and the block manager's tables, call the model exactly once
        (``model(inputs, kv_cache)``) with the engine's ``kv_cache``, take the argmax of each row
        (ties: the lowest token id), ``postprocess``, and return ``(seq_id, token)`` for the
        batch in order."""
        raise NotImplementedError("Part C: LLMEngine.step: schedule, build_model_inputs, one model call, argmax, "
                                  "postprocess")

    def has_unfinished(self) -> bool:
        """Any waiting or running request."""
        raise NotImplementedError("Part C: LLMEngine.has_unfinished")

    def generate(self, prompts, max_new_tokens, eos_token_id: int | None = None) -> list[list[int]]:
        """Validate every request first (the ``add_request`` errors; none is added if one is
        invalid), add them in order, step until nothing is unfinished, return each prompt's
        output in PROMPT order. ``max_new_tokens``: an int or a list (one per prompt)."""
        raise NotImplementedError("Part C: LLMEngine.generate: validate all, add all, step until done, outputs "
                                  "in prompt order")
