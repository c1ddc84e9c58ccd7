"""Speculative decoding (lab 14): the graders' trusted table models, their call logs, the seeded-run driver.

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
"""
from __future__ import annotations

import weakref

import torch

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


def _record(model, seq_len, ids):
    _LOGS.setdefault(model, []).append((int(seq_len), tuple(ids)))   # (a copy of a model logs apart)
    _COUNTS[model] = _COUNTS.get(model, 0) + 1


_IN_PLACE = [(TableModel, "__call__", TableModel.__dict__["__call__"]), (TableModel, "__init__", TableModel.__init__)]
_RECORD, _LOG_STORE, _COUNT_STORE = _record, _LOGS, _COUNTS


def _clear(model) -> None:
    _LOGS[model], _COUNTS[model] = [], 0


def _log_of(model) -> list:
    """``[[seq_len, [ids]], ...]``: the model's calls, after checking that nothing but the model's own
    recorder wrote them (the recorder, the stores and the class's methods are the ones bound at import;
    the log's length is the count of calls recorded; every entry is as recorded)."""
    if type(model) is not TableModel:
        raise TypeError(f"not one of the graders' table models: {type(model).__name__}")
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


def probe_model_log(module, target):
    """The calls ``target`` (a :class:`TableModel`) recorded: ``[[seq_len before, tokens fed], ...]``."""
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
