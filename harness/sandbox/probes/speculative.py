"""Speculative decoding (lab 14): the graders' trusted table models and decoders, their call logs, the
seeded-run driver, the target-only baseline of the perf tests.

``TableModel`` follows the lab's decoding protocol and nothing more: its cache (``TableCache``) stores
token ids (``seq_len``, ``crop``), row t of its logits is ``W[x_t] + P[t] + S[(x_0 + ... + x_t) mod K]``
(a function of the whole prefix, so a stale cache changes what it returns), it refuses a cache past
the length ``make_cache`` asked for. Every call is recorded as ``(seq_len before, the tokens fed)``
in this module's own state, keyed by the model (``_LOGS``), never as an attribute of an object the
submission receives; a second witness (``_COUNTS``, calls per model) and the identity of the
recording code are checked when a log is read (:func:`_log_of`): a log edited in place, or a
recorder replaced, fails the read instead of grading a made-up log.

What a log says still comes from the submission's process: the trusted side treats it as a claim
and replays it against the output tokens (``graders/14``), so a log that disagrees with the tokens
fails whatever made it.

``Decoder`` (the perf tests') follows the same protocol with a Llama-style transformer (RMSNorm, RoPE,
multi-head attention, SwiGLU, untied head) and a K/V cache (``DecoderCache``), logging its calls the
same way. :func:`decoder_pair` builds the contract's pair from a seed: a target whose layers 1.. have
zero output projections (``wo``, ``w2``) and a 1-layer draft sharing its embedding, layer 0, final
norm and head (the same function, so at temperature 0 nearly every proposal is accepted while the
target still pays for every layer). :class:`TargetOnly` is the baseline: the target's KV-cached
greedy decoding, one call per token. The torch functions they use are bound at import, before any
submission, like ``timing.BASELINES``.
"""
from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as _F

_linear, _sdpa, _silu, _rsqrt = _F.linear, _F.scaled_dot_product_attention, _F.silu, torch.rsqrt

_LOGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()    # TableModel -> [(seq_len, (ids...)), ...]
_COUNTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # TableModel -> calls recorded (a second witness)


class Config:
    def __init__(self, vocab_size, max_seq_len):
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len


class TableCache:
    def __init__(self, capacity):
        self.capacity, self.ids = capacity, []

    @property
    def seq_len(self):
        return len(self.ids)

    def crop(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(self.ids):
            raise ValueError(f"crop({n!r}) outside [0, seq_len={len(self.ids)}]")
        del self.ids[n:]


class TableModel:
    """The graders' model (see the module docstring): ``config.vocab_size``, ``config.max_seq_len``,
    ``make_cache(batch_size=1, max_seq_len=None)``, ``model(input_ids (1, T), cache) -> logits (1, T, V)``."""

    def __init__(self, name, W, P, S, max_seq_len, dtype=torch.float64):
        self.name, self.W, self.P, self.S, self.dtype = name, W, P, S, dtype
        self.config = Config(W.shape[0], max_seq_len)
        _LOGS[self], _COUNTS[self] = [], 0

    def make_cache(self, batch_size=1, max_seq_len=None):
        cap = self.config.max_seq_len if max_seq_len is None else int(max_seq_len)
        if batch_size != 1 or not 1 <= cap <= self.config.max_seq_len:
            raise ValueError(f"make_cache({batch_size}, {max_seq_len})")
        return TableCache(cap)

    def __call__(self, input_ids, cache=None):
        if not isinstance(cache, TableCache):
            raise ValueError("the graders' model needs its own cache (make_cache)")
        ids = [int(x) for x in input_ids.reshape(-1).tolist()]
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or not ids:
            raise ValueError(f"input_ids must be (1, T) with T >= 1, got {tuple(input_ids.shape)}")
        _record(self, cache.seq_len, ids)
        if cache.seq_len + len(ids) > cache.capacity:
            raise ValueError(f"cache of {cache.capacity} positions overflows: {cache.seq_len} + {len(ids)}")
        rows = []
        for x in ids:
            cache.ids.append(x)
            t = len(cache.ids) - 1
            rows.append(self.W[x] + self.P[t] + self.S[sum(cache.ids) % self.S.shape[0]])
        return torch.stack(rows)[None].to(self.dtype).to(input_ids.device)


class DecoderCache:
    """K/V of ``capacity`` positions per layer, ``(1, H, capacity, D)``; ``seq_len``, ``crop(n)``."""

    def __init__(self, n_layers, n_heads, head_dim, capacity, dtype, device):
        shape = (1, n_heads, capacity, head_dim)
        self.capacity, self.seq_len = capacity, 0
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]

    def crop(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self.seq_len:
            raise ValueError(f"crop({n!r}) outside [0, seq_len={self.seq_len}]")
        self.seq_len = n


class Decoder:
    """The graders' decoder (see the module docstring): ``config.vocab_size``, ``config.max_seq_len``,
    ``make_cache(batch_size=1, max_seq_len=None)``, ``model(input_ids (1, T), cache) -> logits (1, T, V)``
    float32 (computed in ``dtype``). ``weights``: ``emb (V, d)``, ``layers`` (dicts of ``attn_norm``,
    ``wqkv (3d, d)``, ``wo``, ``mlp_norm``, ``w1``, ``w3 (f, d)``, ``w2 (d, f)``), ``norm``, ``head (V, d)``."""

    def __init__(self, name, weights, n_heads, max_seq_len, rope_theta=10000.0, eps=1e-5):
        self.name, self.w, self.n_heads, self.eps = name, weights, n_heads, eps
        V, d = weights["emb"].shape
        self.config = Config(V, max_seq_len)
        self.head_dim = d // n_heads
        dev = weights["emb"].device
        inv = rope_theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=dev) / self.head_dim)
        ang = torch.arange(max_seq_len, dtype=torch.float64, device=dev)[:, None] * inv   # (max_seq_len, D/2)
        self.cos, self.sin = ang.cos().to(weights["emb"].dtype), ang.sin().to(weights["emb"].dtype)
        _LOGS[self], _COUNTS[self] = [], 0

    def make_cache(self, batch_size=1, max_seq_len=None):
        cap = self.config.max_seq_len if max_seq_len is None else int(max_seq_len)
        if batch_size != 1 or not 1 <= cap <= self.config.max_seq_len:
            raise ValueError(f"make_cache({batch_size}, {max_seq_len})")
        return DecoderCache(len(self.w["layers"]), self.n_heads, self.head_dim, cap, self.w["emb"].dtype,
                            self.w["emb"].device)

    def _rms(self, x, w):
        return x * _rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * w

    def _rope(self, x, start, T):                                   # x (1, H, T, D)
        cos, sin = self.cos[start:start + T], self.sin[start:start + T]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def __call__(self, input_ids, cache=None):
        if not isinstance(cache, DecoderCache):
            raise ValueError("the graders' model needs its own cache (make_cache)")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
            raise ValueError(f"input_ids must be (1, T) with T >= 1, got {tuple(input_ids.shape)}")
        start, T = cache.seq_len, int(input_ids.shape[1])
        _record(self, start, [int(x) for x in input_ids.reshape(-1).tolist()])
        if start + T > cache.capacity:
            raise ValueError(f"cache of {cache.capacity} positions overflows: {start} + {T}")
        H, D = self.n_heads, self.head_dim
        x = self.w["emb"][input_ids]                                                # (1, T, d)
        mask = None
        if T > 1:  # bottom-right causal: query t (position start + t) sees keys 0 .. start + t
            ar = torch.arange(start + T, device=x.device)
            mask = ar[None, :] <= ar[start:, None]
        for i, lw in enumerate(self.w["layers"]):
            h = self._rms(x, lw["attn_norm"])
            q, k, v = _linear(h, lw["wqkv"]).view(1, T, 3, H, D).permute(2, 0, 3, 1, 4)   # each (1, H, T, D)
            q, k = self._rope(q, start, T), self._rope(k, start, T)
            cache.k[i][:, :, start:start + T] = k
            cache.v[i][:, :, start:start + T] = v
            att = _sdpa(q, cache.k[i][:, :, :start + T], cache.v[i][:, :, :start + T], attn_mask=mask)
            x = x + _linear(att.transpose(1, 2).reshape(1, T, H * D), lw["wo"])
            h = self._rms(x, lw["mlp_norm"])
            x = x + _linear(_silu(_linear(h, lw["w1"])) * _linear(h, lw["w3"]), lw["w2"])
        cache.seq_len = start + T
        return _linear(self._rms(x, self.w["norm"]), self.w["head"]).float()


def decoder_pair(spec: dict) -> tuple:
    """``(target, draft)`` :class:`Decoder` s of ``spec``: ``vocab_size``, ``d_model``, ``n_layers``,
    ``n_heads``, ``ffn_hidden``, ``max_seq_len``, ``seed``, ``dtype`` (a name), ``device``. Weights from
    ``torch.Generator().manual_seed(seed)`` (linear ~ N(0, 1/fan_in), embedding ~ N(0, 1), norms 1),
    then ``wo`` and ``w2`` of layers 1.. set to zero; the draft holds the target's embedding, layer 0,
    norm and head (the same tensors)."""
    V, d, f = int(spec["vocab_size"]), int(spec["d_model"]), int(spec["ffn_hidden"])
    dtype, device = getattr(torch, str(spec.get("dtype", "float32"))), torch.device(str(spec.get("device", "cpu")))
    g = torch.Generator().manual_seed(int(spec["seed"]))

    def lin(n_out, n_in):
        return (torch.randn(n_out, n_in, generator=g) / math.sqrt(n_in)).to(device, dtype)

    ones = torch.ones(d, dtype=dtype, device=device)
    emb = torch.randn(V, d, generator=g).to(device, dtype)
    layers = []
    for i in range(int(spec["n_layers"])):
        lw = {"attn_norm": ones, "wqkv": lin(3 * d, d), "wo": lin(d, d), "mlp_norm": ones, "w1": lin(f, d),
              "w3": lin(f, d), "w2": lin(d, f)}
        if i > 0:  # adds exact zeros: the target computes its 1-layer draft's function
            lw["wo"], lw["w2"] = torch.zeros_like(lw["wo"]), torch.zeros_like(lw["w2"])
        layers.append(lw)
    head = lin(V, d)
    n_heads, max_len = int(spec["n_heads"]), int(spec["max_seq_len"])
    target = Decoder("target", {"emb": emb, "layers": layers, "norm": ones, "head": head}, n_heads, max_len)
    draft = Decoder("draft", {"emb": emb, "layers": layers[:1], "norm": ones, "head": head}, n_heads, max_len)
    return target, draft


class TargetOnly:
    """The perf tests' baseline: the target's KV-cached greedy decoding of ``max_new_tokens`` tokens after
    ``input_ids (1, L)``, one call per token (a prefill, then one token at a time). Called with
    ``speculative_generate``'s positional arguments, it decodes with its own :class:`Decoder` over the
    target's weight tensors (``model``; its own dicts and list, so rebinding the target's attributes changes
    nothing here); ``target``, ``draft`` and ``gamma`` are not used. Returns ``(1, L + max_new_tokens)`` int64."""

    def __init__(self, model):
        self.model = model

    def __call__(self, target, draft, input_ids, gamma, max_new_tokens):
        target = self.model
        L = input_ids.shape[1]
        cache = target.make_cache(1, L + max_new_tokens)
        out = [input_ids]
        nxt = target(input_ids, cache)[:, -1:].argmax(-1)                   # (1, 1)
        for i in range(max_new_tokens):
            out.append(nxt)
            if i + 1 < max_new_tokens:
                nxt = target(nxt, cache)[:, -1:].argmax(-1)
        return torch.cat(out, dim=1)


def _record(model, seq_len, ids):
    _LOGS.setdefault(model, []).append((int(seq_len), tuple(ids)))   # (a copy of a model logs apart)
    _COUNTS[model] = _COUNTS.get(model, 0) + 1


_IN_PLACE = [(TableModel, "__call__", TableModel.__dict__["__call__"]), (TableModel, "__init__", TableModel.__init__),
             (Decoder, "__call__", Decoder.__dict__["__call__"]), (Decoder, "__init__", Decoder.__init__)]
_RECORD, _LOG_STORE, _COUNT_STORE = _record, _LOGS, _COUNTS


def _clear(model) -> None:
    _LOGS[model], _COUNTS[model] = [], 0


def _log_of(model) -> list:
    """``[[seq_len, [ids]], ...]``: the model's calls, after checking that nothing but the model's own
    recorder wrote them (the recorder, the stores and the class's methods are the ones bound at import;
    the log's length is the count of calls recorded; every entry is as recorded)."""
    if type(model) not in (TableModel, Decoder):
        raise TypeError(f"not one of the graders' models: {type(model).__name__}")
    g = globals()
    moved = [f"{owner.__name__}.{name}" for owner, name, obj in _IN_PLACE if owner.__dict__.get(name) is not obj]
    moved += [name for name, obj in (("_record", _RECORD), ("_LOGS", _LOG_STORE), ("_COUNTS", _COUNT_STORE))
              if g.get(name) is not obj]
    log, count = _LOG_STORE.get(model), _COUNT_STORE.get(model)
    sound = type(log) is list and type(count) is int and len(log) == count and all(
        type(e) is tuple and len(e) == 2 and type(e[0]) is int and type(e[1]) is tuple
        and all(type(x) is int for x in e[1]) for e in log)
    if moved or not sound:
        raise AssertionError("the graders' model's call log was changed by the code under test "
                             f"({', '.join(moved) or 'its entries or count'}): nothing it claims can be graded")
    return [[s, list(ids)] for s, ids in log]


def probe_build_spec_models(module, tables):
    """One :class:`TableModel` per ``{"name", "W", "P", "S", "max_seq_len", "dtype" (optional, a name)}``,
    kept here (the value: a list of handles)."""
    return [TableModel(str(t["name"]), t["W"], t["P"], t["S"], int(t["max_seq_len"]),
                       dtype=getattr(torch, str(t.get("dtype", "float64")))) for t in tables], {}


def probe_build_spec_decoders(module, spec):
    """``[target, draft, baseline]``: :func:`decoder_pair` of ``spec`` and a :class:`TargetOnly` decoding with
    its own copy of the target, kept here (the value: handles)."""
    target, draft = decoder_pair(spec)
    w = target.w
    own = {**w, "layers": [dict(lw) for lw in w["layers"]]}
    return [target, draft, TargetOnly(Decoder("baseline", own, target.n_heads, target.config.max_seq_len))], {}


def probe_model_log(module, target):
    """The calls ``target`` (a :class:`TableModel` or :class:`Decoder`) recorded: ``[[seq_len before, tokens fed], ...]``."""
    return _log_of(target), {}


def probe_spec_runs(module, fn, target, draft, prompt, gamma, new, kwargs, seeds):
    """``fn(target, draft, prompt, gamma, new, generator=torch.Generator().manual_seed(s), **kwargs)`` for
    each seed ``s`` (both models' logs cleared before each run). Value ``(outs, runs)``: ``outs (len(seeds),
    new)`` int64, the new tokens of each run; ``runs``: per run ``[target's feeds, draft's feeds,
    stats.accepted]`` (each feed the tokens of one call, in order)."""
    outs, runs = [], []
    for s in seeds:
        _clear(target)
        _clear(draft)
        gen = torch.Generator(device=prompt.device).manual_seed(int(s))
        out, st = fn(target, draft, prompt, gamma, new, generator=gen, **kwargs)
        outs.append(out[0, prompt.shape[1]:].to("cpu", torch.int64))
        runs.append([[f for _, f in _log_of(target)], [f for _, f in _log_of(draft)], int(st.accepted)])
    return ((torch.stack(outs) if outs else torch.zeros(0, new, dtype=torch.int64)), runs), {}
