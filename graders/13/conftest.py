"""Shared models and drivers of the lab 13 graders, given to tests as the ``sv`` fixture
(conftest, so it works under ``--import-mode=importlib``).

The contract fixes every block id, so the graders replay traces exactly against their own
models of it:

``RefBlockManager``   Part A's rules, keyed by the exact token prefix (no hashing).
``ContractScheduler`` Part B's rules over any BlockManager-like object: the graders' own
                      ``RefBlockManager``, or a *twin* of the submission's ``BlockManager``
                      (a second instance driven through its public API). Part B is graded
                      against the contract's scheduler over a twin, so a Part A bug never
                      costs Part B points: the twin answers as the submission's own
                      BlockManager does (the contract lets graders hand the scheduler another
                      BlockManager; a trusted one inside the sandbox would need a probe).
``Oracle``            ``TinyLM`` recomputed in float64 from the model's weights, with its own
                      K/V pool: the paged forward (a loop over sequences, written apart from
                      the given vectorized one), the dense forward and greedy decoding alone.
``SchedTrace``        a submission's ``Scheduler`` (over its own ``BlockManager``) beside the
                      contract's over a twin: batches, fields, queues, the pool, per step.
``EngineReplay``      an ``LLMEngine`` beside a replay of the contract (``RefBlockManager`` +
                      ``ContractScheduler`` + the contract's inputs + the oracle): each step's
                      return and the whole K/V pool afterwards (every written slot holds the
                      K/V of the right token at the right position: the effect of all six
                      model inputs). Where the engine leaves the contract's trace, the trace is
                      replayed again over the submission's own ``Scheduler``/``BlockManager``
                      twins and its own ``build_model_inputs``: an engine that follows its own
                      parts loses no engine point for their bugs (graded in parts A, B, C).

Engine tests disable ``model.forward_dense`` and ``model.new_kv_cache`` after the engine is
built (instance attributes set to None): ``reference_generate`` and ``static_generate`` then
fail inside the engine, and the pool is the one ``__init__`` made.

Bulk reads: ``Bulk`` runs ``list(map(fn, ...))`` next to the implementation (through the
builtins the module's own ``torch`` holds), one request for a whole list of calls; without it
(a module with no ``torch``) it calls one by one.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.toolkit import is_remote, one_thread

V = 64                  # the contract's ModelConfig().vocab_size
TIE_TOL = 1e-9          # logits within this of the max are tied (float64 paged vs oracle differ ~1e-14)
POOL_ATOL = 1e-9        # the engine's K/V pool against the oracle's


# --- plumbing ----------------------------------------------------------------------------------

class Bulk:
    """``map(fn, *iterables)`` as one request next to the implementation; ``attrs`` reads fields."""

    def __init__(self, impl):
        self._map = self._list = self._getattr = None
        try:
            b = impl.torch.builtins
            self._map, self._list, self._getattr = b.map, b.list, b.getattr
        except Exception:  # noqa: BLE001 - no torch in the module: one call per item
            pass

    def map(self, fn, *iterables) -> list:
        its = [list(x) for x in iterables]
        if not its or not its[0]:
            return []
        if self._map is None:
            return [fn(*a) for a in zip(*its)]
        return list(self._list(self._map(fn, *its)))

    def attrs(self, objs, names) -> list[dict]:
        objs, names = list(objs), list(names)
        if not objs:
            return []
        flat = self.map(self._getattr or getattr, [o for o in objs for _ in names], [n for _ in objs for n in names])
        k = len(names)
        return [dict(zip(names, flat[i * k:(i + 1) * k])) for i in range(len(objs))]

    def ids(self, container) -> list:
        """``[s.seq_id for s in container]`` (a list of handles, or a handle to a deque)."""
        if self._map is None or not is_remote(container):
            return [s.seq_id for s in container]
        return list(self._list(self._map(self._getattr, container, ["seq_id"] * 10000)))


class Methods:
    """Bound-method handles of ``obj``, fetched once (a proxied call then costs one request)."""

    def __init__(self, obj):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_m", {})

    def __getattr__(self, name):
        m = self._m.get(name)
        if m is None:
            m = self._m[name] = getattr(self._obj, name)
        return m


class PartsBroke(Exception):
    """The submission's own parts raised alike on the graded side and on the replay (a bug graded by
    another test): the trace ends there, its steps so far graded."""

    def __init__(self, step, exc):
        super().__init__(f"step {step}: {type(exc).__name__}: {exc}")
        self.step, self.exc = step, exc


def same_error(a: BaseException, b: BaseException) -> bool:
    return type(a).__name__ == type(b).__name__ and str(a).split("\n")[0] == str(b).split("\n")[0]


def is_no_free(e: BaseException) -> bool:
    """The module's NoFreeBlocksError (a RuntimeError; through the sandbox its name leads the message)."""
    return isinstance(e, RuntimeError) and not isinstance(e, NotImplementedError) and \
        ("NoFreeBlocksError" in type(e).__name__ or str(e).startswith("NoFreeBlocksError"))


def cdiv(a, b):
    return -(-a // b)


def short(x, n=12):
    x = list(x)
    return str(x) if len(x) <= n else str(x[:n])[:-1] + f", ... ({len(x)})]"


# --- Part A: the graders' BlockManager --------------------------------------------------------

class RefNoFree(RuntimeError):
    pass


class RefBlockManager:
    """The contract's BlockManager, keyed by exact token prefixes (the graders' model)."""

    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref = [0] * num_blocks
        self.queue = list(range(num_blocks))
        self.entry: dict[tuple, int] = {}
        self.key_of: dict[int, tuple] = {}
        self.tables: dict = {}
        self.slots: dict = {}
        self.offered: dict = {}

    @property
    def num_free_blocks(self):
        return len(self.queue)

    def hits(self, t):
        B, out = self.block_size, []
        for i in range((len(t) - 1) // B):
            b = self.entry.get(tuple(t[:(i + 1) * B]))
            if b is None:
                break
            out.append(b)
        return out

    def cached_prefix_len(self, t):
        return len(self.hits(t)) * self.block_size

    def can_allocate(self, t):
        hits = self.hits(t)
        return cdiv(len(t), self.block_size) - sum(1 for b in hits if self.ref[b] > 0) <= len(self.queue)

    def _fresh(self):
        b = self.queue.pop(0)
        key = self.key_of.pop(b, None)
        if key is not None:
            del self.entry[key]
        self.ref[b] = 1
        return b

    def allocate(self, sid, t):
        assert sid not in self.tables and len(t) > 0
        if not self.can_allocate(t):
            raise RefNoFree(sid)
        hits = self.hits(t)
        for b in hits:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
        self.tables[sid] = hits + [self._fresh() for _ in range(cdiv(len(t), self.block_size) - len(hits))]
        self.slots[sid], self.offered[sid] = len(t), len(hits)
        return len(hits) * self.block_size

    def can_append(self, sid):
        return self.slots[sid] % self.block_size != 0 or bool(self.queue)

    def append_slot(self, sid):
        B, p, table = self.block_size, self.slots[self.check(sid)], self.tables[sid]
        if p % B == 0:
            if not self.queue:
                raise RefNoFree(sid)
            table.append(self._fresh())
        self.slots[sid] = p + 1
        return table[p // B] * B + p % B

    def cache_full_blocks(self, sid, t):
        B, table = self.block_size, self.tables[self.check(sid)]
        assert len(t) <= self.slots[sid]
        full = len(t) // B
        for i in range(self.offered[sid], full):
            key = tuple(t[:(i + 1) * B])
            if key not in self.entry:
                self.entry[key] = table[i]
                self.key_of[table[i]] = key
        self.offered[sid] = max(self.offered[sid], full)

    def free(self, sid):
        for b in reversed(self.tables[self.check(sid)]):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue.append(b)
        del self.tables[sid], self.slots[sid], self.offered[sid]

    def check(self, sid):
        if sid not in self.tables:
            raise KeyError(sid)
        return sid

    def free_block_ids(self):
        return list(self.queue)

    def ref_count(self, b):
        return self.ref[b]

    def is_cached(self, b):
        return b in self.key_of

    def block_table(self, sid):
        return list(self.tables[self.check(sid)])

    def num_slots(self, sid):
        return self.slots[self.check(sid)]

    def state(self, sids=None):
        sids = sorted(self.tables, key=str) if sids is None else list(sids)
        return {"free": list(self.queue), "ref": list(self.ref),
                "cached": [b in self.key_of for b in range(self.num_blocks)],
                "tables": [list(self.tables[s]) for s in sids], "slots": [self.slots[s] for s in sids]}


def bm_state(bulk, bm, sids, num_blocks):
    """The submission BlockManager's observable state (as ``RefBlockManager.state``)."""
    m = Methods(bm) if not isinstance(bm, Methods) else bm
    blocks = list(range(num_blocks))
    return {"free": list(m.free_block_ids()), "ref": bulk.map(m.ref_count, blocks),
            "cached": [bool(x) for x in bulk.map(m.is_cached, blocks)],
            "tables": [list(t) for t in bulk.map(m.block_table, sids)], "slots": bulk.map(m.num_slots, sids)}


def owned_block_manager(impl, num_blocks, B):
    """A submission BlockManager the graders drive directly (Part A's, Part B's twin), handed first to a
    Scheduler of the submission that is never called (when one can be built): every BlockManager the
    graders drive looks alike to the submission, whichever test drives it, so a BlockManager cannot
    answer Part A honestly and the twin of Part B otherwise."""
    bm = impl.BlockManager(num_blocks, B)
    try:
        impl.Scheduler(bm, 1, 1 << 20)
    except Exception:  # noqa: BLE001 - no Scheduler yet (Part B undone): nothing to look alike to
        pass
    return bm


# --- Part B: the contract's scheduler over any BlockManager ---------------------------------------

class Req:
    """The graders' request (the model's Sequence)."""

    def __init__(self, seq_id, prompt, max_new_tokens, eos_token_id=None):
        self.seq_id, self.prompt, self.max_new_tokens, self.eos_token_id = seq_id, list(prompt), max_new_tokens, \
            eos_token_id
        self.output, self.status, self.num_computed_tokens, self.num_scheduled_tokens = [], "waiting", 0, 0

    @property
    def token_ids(self):
        return self.prompt + self.output


class ContractScheduler:
    """Part B's rules over ``bm`` (a RefBlockManager, or a ``Methods`` of a submission BlockManager).
    Records per step: ``preempted`` (victims in order), ``admitted``."""

    def __init__(self, bm, max_num_seqs, max_num_batched_tokens):
        self.bm, self.max_num_seqs, self.max_num_batched_tokens = bm, max_num_seqs, max_num_batched_tokens
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.preempted: list[Req] = []
        self.admitted: list[Req] = []
        self.computed = 0                          # tokens computed over all steps

    def add(self, req):
        self.waiting.append(req)

    def schedule(self):
        bm, batch, self.preempted, self.admitted = self.bm, [], [], []
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            while not bm.can_append(seq.seq_id):
                victim = self.running.pop()
                bm.free(victim.seq_id)
                victim.status, victim.num_computed_tokens, victim.num_scheduled_tokens = "waiting", 0, 0
                self.waiting.insert(0, victim)
                self.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != "running":
                break
            bm.append_slot(seq.seq_id)
            seq.num_scheduled_tokens = 1
            batch.append(seq)
            i += 1
        if not self.preempted:
            budget = self.max_num_batched_tokens - len(batch)
            while self.waiting and len(self.running) < self.max_num_seqs:
                seq = self.waiting[0]
                t = seq.token_ids
                new = len(t) - bm.cached_prefix_len(t)
                if new > budget or not bm.can_allocate(t):
                    break
                cached = bm.allocate(seq.seq_id, t)
                self.waiting.pop(0)
                self.running.append(seq)
                seq.status, seq.num_computed_tokens, seq.num_scheduled_tokens = "running", cached, new
                batch.append(seq)
                self.admitted.append(seq)
                budget -= new
        self.computed += sum(s.num_scheduled_tokens for s in batch)
        return batch

    def postprocess(self, batch, tokens):
        finished = []
        for seq, tok in zip(batch, tokens):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.bm.cache_full_blocks(seq.seq_id, seq.token_ids[:seq.num_computed_tokens])
            seq.output.append(int(tok))
            if (seq.eos_token_id is not None and tok == seq.eos_token_id) or len(seq.output) == seq.max_new_tokens:
                seq.status = "finished"
                self.bm.free(seq.seq_id)
                self.running.remove(seq)
                finished.append(seq)
        return finished

    def has_unfinished(self):
        return bool(self.waiting or self.running)


def contract_inputs(batch, tables, B):
    """The contract's ``build_model_inputs`` (graders' own), from plain fields: ``batch`` items
    have ``seq_id``, ``num_computed_tokens``, ``num_scheduled_tokens``, ``token_ids``."""
    ids, pos, slots, qsl, ctx = [], [], [], [0], []
    for seq, table in zip(batch, tables):
        c, n, t = seq["num_computed_tokens"], seq["num_scheduled_tokens"], seq["token_ids"]
        ids += t[c:c + n]
        for p in range(c, c + n):
            pos.append(p)
            slots.append(table[p // B] * B + p % B)
        qsl.append(qsl[-1] + n)
        ctx.append(c + n)
    W = max(len(t) for t in tables)
    rows = [list(t) + [-1] * (W - len(t)) for t in tables]
    return tuple(torch.tensor(x, dtype=torch.int64) for x in (ids, pos, slots, qsl, ctx, rows))


INPUT_NAMES = ("input_ids", "positions", "slot_mapping", "query_start_loc", "context_lens", "block_tables")


# --- the oracle: TinyLM in float64 ---------------------------------------------------------------

class Oracle:
    """``TinyLM`` recomputed in float64 from its weights (``state``: the model's state dict)."""

    def __init__(self, state: dict, cfg):
        self.cfg = cfg
        w = {k: v.detach().to("cpu", torch.float64) for k, v in state.items()}
        self.emb, self.norm, self.head = w["tok_emb"], w["norm"], w["lm_head"]
        self.layers = [{k: w[f"layers.{i}.{k}"] for k in ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w1", "w3",
                                                          "w2")} for i in range(cfg["n_layers"])]

    def new_pool(self, num_blocks, B):
        c = self.cfg
        return torch.zeros(c["n_layers"], 2, num_blocks, B, c["n_kv_heads"], c["d_model"] // c["n_heads"],
                           dtype=torch.float64)

    def _rms(self, x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["norm_eps"]) * w

    def _rope(self, x, pos):
        D = x.shape[-1]
        inv = self.cfg["rope_theta"] ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.tensor(pos, dtype=torch.float64)[:, None] * inv
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def _qkv(self, L, x, pos):
        c = self.cfg
        H, Hkv = c["n_heads"], c["n_kv_heads"]
        D = c["d_model"] // H
        h = self._rms(x, L["attn_norm"])
        q = self._rope((h @ L["wq"].T).view(-1, H, D), pos)
        k = self._rope((h @ L["wk"].T).view(-1, Hkv, D), pos)
        return q, k, (h @ L["wv"].T).view(-1, Hkv, D)

    def _attend(self, q, keys, vals, allowed):
        """q (n, H, D), keys/vals (J, Hkv, D), allowed (n, J) -> (n, H*D)."""
        H, Hkv, D = q.shape[1], keys.shape[1], q.shape[2]
        k = keys.repeat_interleave(H // Hkv, dim=1)
        v = vals.repeat_interleave(H // Hkv, dim=1)
        s = torch.einsum("nhd,jhd->nhj", q, k) / math.sqrt(D)
        s = s.masked_fill(~allowed[:, None, :], float("-inf"))
        return torch.einsum("nhj,jhd->nhd", torch.softmax(s, -1), v).reshape(q.shape[0], H * D)

    def _tail(self, L, x, att):
        x = x + att @ L["wo"].T
        h = self._rms(x, L["mlp_norm"])
        return x + (torch.nn.functional.silu(h @ L["w1"].T) * (h @ L["w3"].T)) @ L["w2"].T

    def forward(self, inputs, pool):
        """Writes ``pool`` in place and returns the logits ``(S, V)`` (float64)."""
        ids, pos, slots, qsl, ctx, tables = (t.tolist() for t in inputs)
        B, nb = pool.shape[3], pool.shape[2]
        x = self.emb[torch.tensor(ids)]
        for li, L in enumerate(self.layers):
            q, k, v = self._qkv(L, x, pos)
            pk, pv = pool[li, 0].view(nb * B, *k.shape[1:]), pool[li, 1].view(nb * B, *k.shape[1:])
            pk[torch.tensor(slots)] = k
            pv[torch.tensor(slots)] = v
            att = torch.empty(len(ids), q.shape[1] * q.shape[2], dtype=torch.float64)
            for s in range(len(ctx)):
                lo, hi, J = qsl[s], qsl[s + 1], ctx[s]
                key_slots = torch.tensor([tables[s][j // B] * B + j % B for j in range(J)])
                p = torch.tensor(pos[lo:hi])
                allowed = torch.arange(J)[None, :] <= p[:, None]
                att[lo:hi] = self._attend(q[lo:hi], pk[key_slots], pv[key_slots], allowed)
            x = self._tail(L, x, att)
        last = x[torch.tensor(qsl[1:]) - 1]
        return self._rms(last, self.norm) @ self.head.T

    def dense(self, tokens):
        x = self.emb[torch.tensor(tokens)]
        pos = list(range(len(tokens)))
        causal = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
        for L in self.layers:
            q, k, v = self._qkv(L, x, pos)
            x = self._tail(L, x, self._attend(q, k, v, causal))
        return self._rms(x, self.norm) @ self.head.T

    def greedy(self, prompt, max_new, eos=None):
        """Decoding ``prompt`` alone: ``(tokens, min gap between the top two logits)``."""
        t, out, gap = list(prompt), [], math.inf
        for _ in range(max_new):
            row = self.dense(t)[-1]
            top = torch.topk(row, 2).values
            gap = min(gap, float(top[0] - top[1]))
            tok = int(row.argmax())
            out.append(tok)
            t.append(tok)
            if eos is not None and tok == eos:
                break
        return out, gap

    def follows_greedy(self, prompt, out, tol=TIE_TOL):
        """The first step at which ``out`` is not a greedy continuation of ``prompt`` (a token more than
        ``tol`` below the best logit), or None: one teacher-forced dense forward."""
        if not out:
            return None
        logits = self.dense(list(prompt) + list(out[:-1]))[len(prompt) - 1:]
        for i, (row, tok) in enumerate(zip(logits, out)):
            if not (isinstance(tok, int) and 0 <= tok < row.numel()) or float(row[tok]) < float(row.max()) - tol:
                return i
        return None

    def k0(self, tokens, positions):
        """Layer-0 K of ``tokens`` at ``positions`` (the slot contents that name a token and position)."""
        return self._qkv(self.layers[0], self.emb[torch.tensor(tokens)], list(positions))[1]

    def identify(self, vec, max_pos):
        """(token, position) whose layer-0 K is nearest ``vec (Hkv, D)``."""
        toks = list(range(self.emb.shape[0]))
        best = None
        for p in range(max_pos):
            k = self.k0(toks, [p] * len(toks))
            d = (k - vec).abs().flatten(1).amax(1)
            i = int(d.argmin())
            if best is None or float(d[i]) < best[0]:
                best = (float(d[i]), toks[i], p)
        return best[1], best[2], best[0]


def pick(row, strict=False):
    """The contract's argmax (ties: the lowest id) and the ids within TIE_TOL of the max."""
    m = float(row.max())
    near = [int(i) for i in (row >= m - TIE_TOL).nonzero().flatten()]
    return near[0], (near[:1] if strict else near)


# --- Part B driver: a submission's Scheduler beside the contract's over a twin ---------------------

class SchedTrace:
    """Drive ``impl.Scheduler`` (over its own ``impl.BlockManager``) and ``ContractScheduler`` over a
    twin ``impl.BlockManager`` with the same requests and tokens, step by step.

    ``plan[sid]``: the tokens the "model" returns for request sid, in order (preemption keeps the
    output, so the k-th token of a request is fixed). ``compare``: what each step compares
    (``"batch"`` ids and order, ``"queues"`` waiting and running ids, ``"fields"``: num_computed
    and num_scheduled of the batch, ``"waiting_fields"``: num_computed of waiting requests,
    ``"pool"``: the free queue after schedule, ``"after"``: the free queue after postprocess)."""

    def __init__(self, impl, bulk, num_blocks, B, max_num_seqs, max_num_batched_tokens, compare, twin_first=False):
        self.impl, self.bulk, self.nb, self.B = impl, bulk, num_blocks, B
        self.max_num_seqs, self.max_tokens = max_num_seqs, max_num_batched_tokens
        twin = owned_block_manager(impl, num_blocks, B) if twin_first else None
        self.sbm = impl.BlockManager(num_blocks, B)
        self.sched = impl.Scheduler(self.sbm, max_num_seqs, max_num_batched_tokens)
        self.s = Methods(self.sched)
        self.sm = Methods(self.sbm)
        self.tm = Methods(twin if twin is not None else owned_block_manager(impl, num_blocks, B))
        self.model = ContractScheduler(self.tm, max_num_seqs, max_num_batched_tokens)
        self.compare, self.broke = set(compare), None
        self.handles, self.reqs, self.plan, self.steps, self.log = {}, {}, {}, 0, []
        self.case = f"num_blocks={num_blocks}, block_size={B}, max_num_seqs={max_num_seqs}, " \
                    f"max_num_batched_tokens={max_num_batched_tokens}"

    def add(self, sid, prompt, plan, eos=None):
        """Request ``sid``: ``max_new_tokens = len(plan)``; ``plan``: the tokens it will be given."""
        self.handles[sid] = h = self.impl.Sequence(sid, list(prompt), len(plan), eos)
        self.reqs[sid] = Req(sid, prompt, len(plan), eos)
        self.plan[sid] = list(plan)
        self.s.add(h)
        self.model.add(self.reqs[sid])

    def _fail(self, msg):
        hist = " | ".join(self.log[-4:])
        raise AssertionError(f"{msg} ({self.case}; the contract's steps so far: {hist})")

    def _fields(self, sids):
        return dict(zip(sids, self.bulk.attrs([self.handles[s] for s in sids],
                                              ["status", "num_computed_tokens", "num_scheduled_tokens"])))

    def step(self):
        """One schedule + postprocess on both sides; returns the contract's batch (Reqs)."""
        before = {sid: (r.status, r.num_computed_tokens) for sid, r in self.reqs.items()}
        running_before = [r.seq_id for r in self.model.running]
        waiting_before = [r.seq_id for r in self.model.waiting]
        live = [sid for sid in self.reqs if before[sid][0] != "finished"]
        try:
            batch_h = list(self.s.schedule())
        except Exception as mine:  # noqa: BLE001 - graded below against the contract over the twin
            try:
                self.model.schedule()
            except Exception as theirs:  # noqa: BLE001 - the submission's BlockManager raised (Part A's)
                if same_error(mine, theirs):
                    raise PartsBroke(self.steps, mine) from None
            self._fail(f"schedule() raised {type(mine).__name__}: {str(mine)[:300]} at step {self.steps}")
        try:
            want = self.model.schedule()
        except Exception as theirs:  # noqa: BLE001 - the twin BlockManager raised on the contract's calls
            self._fail(f"the contract's calls raised {type(theirs).__name__}: {str(theirs)[:200]} on your "
                       f"BlockManager where your scheduler's did not (step {self.steps})")
        want_ids = [r.seq_id for r in want]
        self.log.append(f"step {self.steps}: batch {want_ids} tokens {[r.num_scheduled_tokens for r in want]}"
                        + (f", preempted {[r.seq_id for r in self.model.preempted]}" if self.model.preempted else ""))
        got_ids = self.bulk.ids(batch_h)
        fields = None
        if "batch" in self.compare and got_ids != want_ids:
            fields = self._fields(live)
            self._fail(diagnose_batch(self, got_ids, want_ids, fields, before, running_before, waiting_before))
        if "queues" in self.compare:
            got_w, got_r = self.bulk.ids(self.sched.waiting), self.bulk.ids(self.sched.running)
            want_w, want_r = [r.seq_id for r in self.model.waiting], [r.seq_id for r in self.model.running]
            if (got_w, got_r) != (want_w, want_r):
                self._fail(diagnose_queues(self, got_w, got_r, want_w, want_r, running_before))
        if self.compare & {"fields", "waiting_fields"}:
            fields = fields or self._fields(live)
        if "fields" in self.compare:
            for r in want:
                f = fields[r.seq_id]
                got, exp = (f["num_computed_tokens"], f["num_scheduled_tokens"]), \
                    (r.num_computed_tokens, r.num_scheduled_tokens)
                if got != exp:
                    self._fail(diagnose_fields(self, r, got, exp))
        if "waiting_fields" in self.compare:
            for r in self.model.waiting:
                f = fields.get(r.seq_id)
                if f is not None and f["num_computed_tokens"] != 0:
                    self._fail(f"a preempted request kept its num_computed_tokens: seq {r.seq_id} waits again with "
                               f"num_computed_tokens={f['num_computed_tokens']} at step {self.steps}; preemption "
                               f"frees its blocks, so it must be 0 (prompt + output are recomputed at readmission)")
        if "pool" in self.compare:
            got, exp = list(self.sm.free_block_ids()), list(self.tm.free_block_ids())
            if got != exp:
                self._fail(f"the scheduler changed the pool other than by the contract's calls: after schedule() at "
                           f"step {self.steps} its BlockManager's free queue is {short(got, 16)}, the same "
                           f"BlockManager driven by the contract's calls has {short(exp, 16)} (allocate only a "
                           f"request you admit: allocate() then free() to test whether it fits reorders the queue)")
        toks = [self.plan[r.seq_id][len(r.output)] for r in want]
        try:
            got_fin = self.bulk.ids(self.s.postprocess(batch_h, toks))
        except Exception as mine:  # noqa: BLE001
            try:
                self.model.postprocess(want, toks)
            except Exception as theirs:  # noqa: BLE001 - the submission's BlockManager raised (Part A's)
                if same_error(mine, theirs):
                    raise PartsBroke(self.steps, mine) from None
            self._fail(f"postprocess() raised {type(mine).__name__}: {str(mine)[:300]} at step {self.steps}")
        want_fin = [r.seq_id for r in self.model.postprocess(want, toks)]
        if got_fin != want_fin and "batch" in self.compare:
            self._fail(f"postprocess at step {self.steps} returned finished {got_fin}, the contract {want_fin} "
                       f"(tokens {toks}; a request finishes at its EOS or at max_new_tokens)")
        if "after" in self.compare:
            got, exp = list(self.sm.free_block_ids()), list(self.tm.free_block_ids())
            if got != exp:
                self._fail(f"a finished sequence kept its blocks one step: after postprocess() at step {self.steps} "
                           f"finished {want_fin}, the free queue is {short(got, 16)}, the contract's "
                           f"{short(exp, 16)}; free a finished request's blocks in postprocess, before the next "
                           f"schedule()")
        self.steps += 1
        return want

    def run(self, arrivals, max_steps=200):
        """``arrivals``: {step: [(sid, prompt, plan, eos)]}; steps until nothing is left. Returns the
        step count. The contract's run must finish every request (a BlockManager that lets nothing
        run would make every scheduler trivially right), unless the submission's BlockManager raised
        alike under both schedulers after at least two steps were checked (a Part A bug: the steps
        before it are graded, the rest cannot be)."""
        while True:
            for a in arrivals.get(self.steps, []):
                self.add(*a)
            if not self.model.has_unfinished() and self.steps >= max(arrivals, default=0):
                break
            if self.steps >= max_steps:
                self._fail("the contract's scheduler over this BlockManager did not finish the trace: "
                           "Part B cannot be graded on a BlockManager that lets no request run (see Part A)")
            try:
                self.step()
            except PartsBroke as e:
                if self.steps < 2:
                    self._fail(f"your BlockManager raised under the contract's calls as under your scheduler's before "
                               f"two steps could be checked ({e}): Part B cannot be graded on it (see Part A)")
                self.broke = e
                return self.steps
        unfinished = [r.seq_id for r in self.reqs.values() if r.status != "finished"]
        if unfinished:
            self._fail(f"requests {unfinished} never finished")
        if bool(self.s.has_unfinished()):
            self._fail("has_unfinished() is True after every request finished")
        return self.steps


def diagnose_batch(tr, got, want, fields, before, running_before, waiting_before):
    """Name the bug class of a batch that differs from the contract's."""
    m = tr.model
    pre = [r.seq_id for r in m.preempted]
    case = f"step {tr.steps}: batch {got}, the contract's {want}"
    status = {sid: f["status"] for sid, f in fields.items()}
    got_pre = [sid for sid in running_before if status.get(sid) == "waiting"]
    if pre and got_pre and got_pre != pre:
        older = running_before.index(got_pre[0]) < running_before.index(pre[0])
        if older:
            return (f"preempted the oldest instead of the newest: {case}; the pool ran out of blocks and the "
                    f"scheduler preempted seq {got_pre[0]} (running order {running_before}), the contract preempts "
                    f"the most recently admitted, seq {pre[0]}")
        return f"preemption victims {got_pre}, the contract's {pre} (running order {running_before}): {case}"
    admitted = [sid for sid in got if before.get(sid, ("waiting",))[0] == "waiting"]
    extra = [sid for sid in got if sid not in want]
    if pre and extra and all(sid in got for sid in want) and got[:len(want)] == want:
        admitted = extra
    if pre and admitted:
        return (f"admitted a request in a step that preempted: {case}; seq {pre[0]} was preempted in this step, so "
                f"nothing is admitted (vLLM V1: else the victim or a newcomer takes the blocks just freed), "
                f"but {admitted} were")
    want_adm = [r.seq_id for r in m.admitted]
    if pre and not got_pre:
        return f"no preemption where the contract preempts {pre} (the pool had no block for a decode): {case}"
    tokens_of = {sid: f["num_scheduled_tokens"] for sid, f in fields.items()}
    total = sum(tokens_of.get(sid, 0) for sid in got)
    if total > tr.max_tokens:
        return (f"token budget exceeded (budget counted in sequences, not tokens?): {case}; the batch computes "
                f"{total} tokens > max_num_batched_tokens={tr.max_tokens}")
    if len([s for s in got]) > tr.max_num_seqs or len(running_before) + len(admitted) > tr.max_num_seqs:
        return f"more than max_num_seqs={tr.max_num_seqs} running: {case}"
    if admitted and waiting_before and admitted[0] != waiting_before[0] and waiting_before[0] not in admitted:
        return (f"skipped the blocked head of waiting: {case}; seq {waiting_before[0]} is first in line and did "
                f"not fit, so admission stops there (head-of-line blocking; never skip to a later request), but "
                f"seq {admitted[0]} was admitted")
    if len(admitted) < len(want_adm):
        first = tr.reqs[want_adm[len(admitted)]]
        t, cached = first.token_ids, first.num_computed_tokens   # the contract admitted it: c = its cached tokens
        if cached > 0:
            return (f"the token budget counted cached tokens: {case}; seq {first.seq_id} needs {len(t) - cached} "
                    f"new tokens ({len(t)} minus {cached} cached) and fits the budget left, but was not admitted")
        if running_before and not admitted:
            return (f"static batching: no request joins a running batch: {case}; seq {first.seq_id} fits (pool, "
                    f"max_num_seqs={tr.max_num_seqs}, max_num_batched_tokens={tr.max_tokens}) and is admitted "
                    f"while {running_before} decode (continuous batching, Orca)")
        return f"seq {first.seq_id} fits and was not admitted: {case}"
    if len(admitted) > len(want_adm):
        extra = admitted[len(want_adm)]
        return (f"admitted seq {extra} that does not fit (token budget max_num_batched_tokens={tr.max_tokens}, "
                f"max_num_seqs={tr.max_num_seqs}, or the pool): {case}")
    return f"the batch differs from the contract's: {case}"


def diagnose_queues(tr, got_w, got_r, want_w, want_r, running_before):
    pre = [r.seq_id for r in tr.model.preempted]
    case = f"step {tr.steps}: waiting {got_w}, running {got_r}; the contract's waiting {want_w}, running {want_r}"
    if pre and sorted(got_w) == sorted(want_w) and got_w != want_w and pre[-1] in got_w \
            and got_w.index(pre[-1]) > want_w.index(pre[-1]):
        return (f"a preempted request was put at the back of waiting instead of the front: {case}; seq {pre[-1]} was "
                f"preempted and must be readmitted first (appendleft)")
    return f"the queues differ from the contract's: {case}"


def diagnose_fields(tr, r, got, exp):
    c, n = got
    ec, en = exp
    t = r.token_ids
    if ec > 0 and c == 0 and n == ec + en:
        return (f"prefix hits recomputed: step {tr.steps}, seq {r.seq_id} ({len(t)} tokens, {ec} of them cached) has "
                f"num_computed_tokens={c}, num_scheduled_tokens={n}; the contract computes only the {en} tokens "
                f"after its cached prefix (num_computed_tokens = the cached tokens)")
    return (f"seq {r.seq_id} at step {tr.steps}: num_computed_tokens={c}, num_scheduled_tokens={n}; the contract's "
            f"{ec} and {en} ({len(t)} tokens)")


# --- Part C driver: an engine beside the contract's replay -----------------------------------------

class EngineDeviation(AssertionError):
    pass


class EngineReplay:
    """Drive ``impl.LLMEngine`` step by step beside a replay. ``mode="contract"``: the graders' own
    scheduler, BlockManager and inputs; ``mode="twin"``: the submission's ``Scheduler`` over its own
    ``BlockManager`` (twins) and its ``build_model_inputs`` (or the contract's inputs from the
    twins' state). Either way the oracle plays the model, and after each step the engine's return
    and its whole K/V pool must equal the replay's."""

    def __init__(self, sv, impl, model_args, cfg, num_blocks, B, max_num_seqs, max_tokens, mode, strict_ties=False,
                 state=None):
        self.impl, self.bulk, self.cfg, self.nb, self.B, self.mode = impl, sv.bulk(impl), cfg, num_blocks, B, mode
        self.strict = strict_ties
        self.model = impl.TinyLM(*model_args)
        if state is not None:
            self.model.load_state_dict(state)
        self.oracle = Oracle(state if state is not None else self.model.state_dict(), cfg)
        self.engine = impl.LLMEngine(self.model, num_blocks, B, max_num_seqs=max_num_seqs,
                                     max_num_batched_tokens=max_tokens)
        self.model.forward_dense = None   # reference_generate and static_generate fail inside the engine
        self.model.new_kv_cache = None    # the pool is the one __init__ made
        self.e = Methods(self.engine)
        self.pool = self.oracle.new_pool(num_blocks, B)
        self.case = f"block_size={B}, num_blocks={num_blocks}, max_num_seqs={max_num_seqs}, " \
                    f"max_num_batched_tokens={max_tokens}"
        if mode == "contract":
            self.bm = RefBlockManager(num_blocks, B)
            self.sched = ContractScheduler(self.bm, max_num_seqs, max_tokens)
        else:
            self.tbm = impl.BlockManager(num_blocks, B)
            self.tb = Methods(self.tbm)
            self.ts = Methods(impl.Scheduler(self.tbm, max_num_seqs, max_tokens))
        self.reqs, self.twins, self.steps, self.log, self.next_id = {}, {}, 0, [], 0
        self.verified, self.broke, self._bmi_exc = 0, None, None   # steps whose model call was checked

    def add(self, prompt, max_new, eos=None):
        sid = self.e.add_request(list(prompt), max_new, eos)
        if sid != self.next_id:
            raise EngineDeviation(f"add_request returned id {sid!r}, expected {self.next_id} (ids 0, 1, 2, ... in call "
                                  f"order; a rejected request takes no id)")
        self.next_id += 1
        self.reqs[sid] = Req(sid, prompt, max_new, eos)
        if self.mode == "contract":
            self.sched.add(self.reqs[sid])
        else:
            self.twins[sid] = self.impl.Sequence(sid, list(prompt), max_new, eos)
            self.ts.add(self.twins[sid])
        return sid

    def _expected(self):
        """``(batch fields, [(inputs, label)])`` of the replay's next step (the batch empty: None)."""
        if self.mode == "contract":
            batch = self.sched.schedule()
            if not batch:
                return None, []
            fields = [{"seq_id": r.seq_id, "num_computed_tokens": r.num_computed_tokens,
                       "num_scheduled_tokens": r.num_scheduled_tokens, "token_ids": r.token_ids} for r in batch]
            tables = [self.bm.block_table(r.seq_id) for r in batch]
            self._batch = batch
            return fields, [(contract_inputs(fields, tables, self.B), "the contract's inputs")]
        batch = list(self.ts.schedule())
        if not batch:
            return None, []
        self._batch = batch
        fields = self.bulk.attrs(batch, ["seq_id", "num_computed_tokens", "num_scheduled_tokens", "token_ids"])
        tables = [list(t) for t in self.bulk.map(self.tb.block_table, [f["seq_id"] for f in fields])]
        out, self._bmi_exc = [], None
        try:
            out.append((contract_inputs(fields, tables, self.B), "inputs built from your scheduler's state"))
        except Exception:  # noqa: BLE001 - a table too short for its fields: only the submission's own inputs
            pass
        try:
            mine = tuple(self.impl.build_model_inputs(batch, tables, self.B))
            if not out or any(not torch.equal(a, b) for a, b in zip(mine, out[0][0])):
                out.append((tuple(t.to(torch.int64) for t in mine), "your build_model_inputs"))
        except Exception as e:  # noqa: BLE001 - its bugs are graded by the build_model_inputs tests
            self._bmi_exc = e
        return fields, out

    def _run_variant(self, inputs):
        pool = self.pool.clone()
        try:
            logits = self.oracle.forward(inputs, pool)
        except Exception:  # noqa: BLE001 - malformed inputs: the given model refuses them too
            return None
        return pool, logits

    def step(self):
        twin_exc = None
        try:
            fields, variants = self._expected()
        except Exception as e:  # noqa: BLE001 - only the submission's parts can raise here (twin mode)
            if self.mode == "contract":
                raise
            fields, variants, twin_exc = None, [], e
        if fields is not None and not variants and self.mode == "twin":
            twin_exc = self._bmi_exc
        try:
            got = self.e.step()
        except Exception as e:  # noqa: BLE001
            if twin_exc is not None and same_error(e, twin_exc):
                raise PartsBroke(self.steps, e) from None
            if not isinstance(e, TypeError) or "NoneType" not in str(e) or "callable" not in str(e):
                raise
            if True:
                raise EngineDeviation(
                    f"the engine called model.forward_dense or model.new_kv_cache after __init__ (the graders "
                    f"disabled both: reference_generate and static_generate use them): compute logits only with "
                    f"model(inputs, self.kv_cache), the pool made once in __init__ ({self.case}, step "
                    f"{self.steps}): {e}") from None
        if twin_exc is not None:
            raise EngineDeviation(f"step {self.steps} ran where your own parts raise {type(twin_exc).__name__}: "
                                  f"{str(twin_exc)[:300]} ({self.case}); the contract's replay left too")
        got = [tuple(x) for x in got] if isinstance(got, (list, tuple)) else got
        kv = self.engine.kv_cache
        if fields is None:
            if got != []:
                raise EngineDeviation(f"step() returned {got!r} with nothing to run, expected [] ({self.case}, step "
                                      f"{self.steps})")
            self.steps += 1
            return []
        ids = [f["seq_id"] for f in fields]
        tried = []
        for inputs, label in variants:
            res = self._run_variant(inputs)
            if res is None:
                continue
            pool, logits = res
            toks, ok = [], isinstance(got, list) and len(got) == len(ids)
            for s, row in enumerate(logits):
                want, near = pick(row, self.strict)
                mine = got[s][1] if ok and len(got[s]) == 2 else None
                toks.append(mine if mine in near else want)
                ok = ok and got[s][0] == ids[s] and mine in near
            same_pool = isinstance(kv, torch.Tensor) and kv.shape == pool.shape and \
                torch.allclose(kv.to(torch.float64), pool, atol=POOL_ATOL, rtol=0)
            tried.append((label, inputs, pool, logits, toks, ok, same_pool))
            if ok and same_pool:
                self.verified += 1
                self.pool = pool
                self.log.append(f"step {self.steps}: {list(zip(ids, toks))}")
                if self.mode == "contract":
                    self.sched.postprocess(self._batch, toks)
                else:
                    self.ts.postprocess(self._batch, toks)
                self.steps += 1
                return got
        raise EngineDeviation(self._diagnose(got, kv, ids, tried))

    def _diagnose(self, got, kv, ids, tried):
        where = f"{self.case}, step {self.steps}"
        if not tried:
            return f"no valid model inputs for step {self.steps} ({where})"
        label, inputs, pool, logits, toks, ok, same_pool = tried[0]
        want = list(zip(ids, toks))
        if not isinstance(kv, torch.Tensor) or kv.shape != pool.shape:
            return (f"the engine's kv_cache is not the model's pool: {type(kv).__name__} "
                    f"{tuple(getattr(kv, 'shape', ()))}, expected {tuple(pool.shape)} from model.new_kv_cache "
                    f"({where})")
        if not same_pool:
            diff = (kv.to(torch.float64) - pool).abs().amax(dim=(0, 1, 4, 5))   # (num_blocks, B)
            wrong = [(int(b) * self.B + int(o)) for b, o in (diff > POOL_ATOL).nonzero().tolist()]
            written = set(inputs[2].tolist())
            old = (self.pool - pool).abs().amax(dim=(0, 1, 4, 5)).flatten()
            if (kv.to(torch.float64) - self.pool).abs().max() <= POOL_ATOL:
                return (f"the model did not write the engine's K/V pool in this step (kv_cache unchanged): the "
                        f"forward must get the engine's kv_cache, the pool new_kv_cache made in __init__ ({where})")
            slot = wrong[0]
            vec = kv.to(torch.float64)[0, 0].reshape(-1, *kv.shape[-2:])[slot]
            pos_of = dict(zip(inputs[2].tolist(), inputs[1].tolist()))
            tok_of = dict(zip(inputs[2].tolist(), inputs[0].tolist()))
            max_pos = int(inputs[4].max()) + 2
            tok, pos, err = self.oracle.identify(vec, max(max_pos, 2))
            if slot in written:
                return (f"the model's inputs differ from {label}: slot {slot} should hold token {tok_of[slot]} at "
                        f"position {pos_of[slot]}; the engine's pool holds "
                        + (f"token {tok} at position {pos}" if err < 1e-6 else "other K/V")
                        + f" there ({len(wrong)} slots differ; expected inputs: "
                        + ", ".join(f"{n} {short(t.tolist())}" for n, t in zip(INPUT_NAMES, inputs)) + f"; {where})")
            return (f"the engine wrote K/V where the model's inputs do not: slot {slot} changed "
                    + (f"(token {tok} at position {pos})" if err < 1e-6 else "")
                    + f"; expected slot_mapping {short(inputs[2].tolist())} ({where})")
        if not isinstance(got, list) or len(got) != len(ids) or [g[0] for g in got] != ids:
            return (f"step() returned {got!r:.300}, expected (seq_id, token) for the batch in order {want} ({where})")
        bad = [(g, w) for g, w in zip(got, want) if g != w]
        s = ids.index(bad[0][0][0])
        row = logits[s]
        tok, near = pick(row, True)
        if len(pick(row)[1]) > 1:
            return (f"argmax ties must go to the lowest token id: seq {ids[s]}'s logits tie between tokens "
                    f"{pick(row)[1]}, step() chose {bad[0][0][1]}, expected {tok} ({where})")
        chosen = bad[0][0][1]
        got_logit = float(row[chosen]) if isinstance(chosen, int) and 0 <= chosen < row.numel() else float("nan")
        return (f"step() returned {got}, expected {want}: seq {ids[s]}'s token {chosen} is not the argmax of its "
                f"logits (token {tok}, logit {float(row[tok]):.6g}; token {chosen}: {got_logit:.6g}) ({where})")

    def run(self, arrivals, max_steps=300):
        """``arrivals``: {step: [(prompt, max_new, eos)]}; steps until nothing is left. Every request must
        finish with a full output (its max_new_tokens, or up to EOS). Returns the outputs by id."""
        while True:
            for a in arrivals.get(self.steps, []):
                self.add(*a)
            if self.steps >= max(arrivals, default=0) and not self._unfinished():
                break
            if self.steps >= max_steps:
                raise EngineDeviation(f"the replay did not finish within {max_steps} steps ({self.case})")
            try:
                self.step()
            except PartsBroke as e:
                if self.verified < 1:
                    raise EngineDeviation(f"your own Scheduler, BlockManager or build_model_inputs raised ({e}) before "
                                          f"a model call of the engine could be checked ({self.case})") from None
                self.broke = e
                return None
        return self.finish()

    def _unfinished(self):
        if self.mode == "contract":
            return self.sched.has_unfinished()
        return bool(self.ts.has_unfinished())

    def finish(self):
        if bool(self.e.has_unfinished()):
            raise EngineDeviation(f"has_unfinished() is True after every request finished ({self.case})")
        outs = {}
        seqs = self.engine.sequences
        for sid, r in self.reqs.items():
            out = list(seqs[sid].output)
            if self.mode == "contract":
                want = r.output
            else:
                want = list(self.twins[sid].output)
            if out != want:
                raise EngineDeviation(f"request {sid}'s output is {out}, the steps returned {want} ({self.case})")
            full = len(out) == r.max_new_tokens or (r.eos_token_id is not None and out and out[-1] == r.eos_token_id)
            if not full:
                raise EngineDeviation(f"request {sid} finished with {len(out)} of {r.max_new_tokens} tokens and no "
                                      f"EOS: its output is not complete ({self.case})")
            outs[sid] = out
        return outs


def replay(sv, impl, model_args, cfg, num_blocks, B, max_num_seqs, max_tokens, arrivals, strict_ties=False,
           state=None, before=None, after=None):
    """Run ``arrivals`` through a fresh engine beside the contract's replay; where the engine leaves it,
    run again beside the submission's own parts (twin mode). Returns ``(replay, outputs)`` of the run
    the engine followed; raises the first deviation when it follows neither (the twin run's
    diagnosis, which compares the engine with its own parts)."""
    first = None
    for mode in ("contract", "twin"):
        r = EngineReplay(sv, impl, model_args, cfg, num_blocks, B, max_num_seqs, max_tokens, mode,
                         strict_ties=strict_ties, state=state)
        try:
            if before is not None:
                before(r)
            outs = r.run(arrivals)
            if after is not None:
                after(r)
            return r, outs
        except EngineDeviation as e:
            first = first or e
            if mode == "twin":
                raise AssertionError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - the submission's parts raised in the twin replay
            if mode == "twin":
                raise AssertionError(f"{first}" if first else f"{type(e).__name__}: {e}") from None
            first = first or EngineDeviation(f"{type(e).__name__}: {e}")
    raise AssertionError(str(first))


CFG = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64,
       "max_seq_len": 256, "rope_theta": 10000.0, "norm_eps": 1e-6}


def prompts_with_gap(oracle, gen, n, lengths, max_new, min_gap=1e-6):
    """``n`` random prompts whose greedy decoding alone keeps a top-1/top-2 gap >= ``min_gap``."""
    out = []
    while len(out) < n:
        L = int(lengths[len(out) % len(lengths)])
        p = torch.randint(0, V, (L,), generator=gen).tolist()
        toks, gap = oracle.greedy(p, max_new)
        if gap >= min_gap:
            out.append((p, toks))
    return out


@pytest.fixture(autouse=True)
def _one_thread(impl):
    """torch's intra-op threads at 1 on both sides (``harness.toolkit.one_thread``)."""
    with one_thread(impl):
        yield


@pytest.fixture
def sv():
    return SimpleNamespace(bulk=Bulk, Methods=Methods, RefBlockManager=RefBlockManager, Req=Req,
                           ContractScheduler=ContractScheduler, SchedTrace=SchedTrace, Oracle=Oracle,
                           EngineReplay=EngineReplay, replay=replay, contract_inputs=contract_inputs, CFG=CFG,
                           INPUT_NAMES=INPUT_NAMES, bm_state=bm_state, is_no_free=is_no_free, cdiv=cdiv,
                           same_error=same_error, owned_block_manager=owned_block_manager,
                           short=short, pick=pick, prompts_with_gap=prompts_with_gap, V=V)
