"""Hidden graders for lab 13, Part C: build_model_inputs and the LLMEngine.

``build_model_inputs`` is graded on hand-built batches (the module's given ``Sequence``
with fields set here) against the contract's six tensors.

The engine runs on the graders' own ``TinyLM`` instance (weights from the run seed;
``forward_dense`` and ``new_kv_cache`` disabled once the engine is built) beside the
contract's replay (``sv.replay``): after every ``step()`` its return and its whole K/V pool
must equal the replay's, whose model is the float64 oracle. An engine that leaves the
contract's trace only where its own Scheduler, BlockManager or build_model_inputs do
(graded in parts A, B and here) is replayed again beside those parts and loses nothing
here. Every request of a replay must finish with a complete output, so an engine that
runs nothing earns nothing. Prompts are drawn from the run seed until decoding each alone
keeps a top-1/top-2 logit gap >= 1e-6 (the contract's rule).
"""
from __future__ import annotations

import pytest
import torch

from harness.toolkit import expect_raises, timed

V = 64


def _tokens(gen, n):
    return torch.randint(0, V, (n,), generator=gen).tolist()


def _seq(impl, sid, prompt, output, c, n):
    s = impl.Sequence(sid, list(prompt), 50)
    for name, value in (("output", list(output)), ("num_computed_tokens", c), ("num_scheduled_tokens", n)):
        setattr(s, name, value)
    return s


# --- build_model_inputs -----------------------------------------------------------------------------

def _batch_case(gen, name):
    """``(B, [(prompt, output, c, n, table)])`` of a designed batch; tables hold distinct block ids."""
    ids = torch.randperm(60, generator=gen).tolist()

    def table(k):
        return [ids.pop() for _ in range(k)]
    if name == "decode-B4":           # three decodes; the second at a full block's last position (7 = 2*4 - 1);
        B = 4                         # tables one block longer than needed (allowed: they reach c + n - 1)
        rows = [(_tokens(gen, 5), _tokens(gen, 2), 6, 1, table(3)), (_tokens(gen, 6), _tokens(gen, 2), 7, 1, table(3)),
                (_tokens(gen, 3), _tokens(gen, 1), 3, 1, table(2))]
    elif name == "prefix-B4":         # a prefill after 8 cached tokens, a decode, a fresh prefill
        B = 4
        rows = [(_tokens(gen, 13), [], 8, 5, table(4)), (_tokens(gen, 4), _tokens(gen, 6), 9, 1, table(3)),
                (_tokens(gen, 6), [], 0, 6, table(2))]
    elif name == "readmit-B5":        # a readmitted request (prompt + output recomputed after 5 cached tokens)
        B = 5
        rows = [(_tokens(gen, 2), _tokens(gen, 8), 9, 1, table(2)), (_tokens(gen, 7), _tokens(gen, 5), 5, 7, table(3))]
    else:                             # block size 1
        B = 1
        rows = [(_tokens(gen, 3), _tokens(gen, 1), 3, 1, table(4)), (_tokens(gen, 2), [], 0, 2, table(2))]
    return B, rows


def _want_inputs(sv, B, rows):
    fields = [{"num_computed_tokens": c, "num_scheduled_tokens": n, "token_ids": p + o} for p, o, c, n, _ in rows]
    return sv.contract_inputs(fields, [t for *_, t in rows], B)


def _inputs_problem(got, want, B, rows):
    """The bug class of the first tensor that differs, with the smallest failing element."""
    names = ("input_ids", "positions", "slot_mapping", "query_start_loc", "context_lens", "block_tables")
    if not isinstance(got, (tuple, list)) or len(got) != 6:
        return f"build_model_inputs returned {type(got).__name__}, expected a ModelInputs of six tensors"
    for name, g, w in zip(names, got, want):
        if not isinstance(g, torch.Tensor) or g.dtype != torch.int64 or g.device.type != "cpu":
            return f"{name} must be an int64 CPU tensor, got {getattr(g, 'dtype', type(g).__name__)}"
        if g.shape != w.shape or not torch.equal(g, w):
            if name == "positions":
                for s, (p, o, c, n, _) in enumerate(rows):
                    lo = sum(r[3] for r in rows[:s])
                    mine = g[lo:lo + n].tolist() if g.shape == w.shape else None
                    if c > 0 and mine == list(range(n)):
                        return (f"positions restart at 0: sequence {s} of the batch computes positions {c}..{c + n - 1} "
                                f"after {c} computed tokens, positions is {g.tolist()}, expected {w.tolist()}")
            if name == "slot_mapping" and g.shape == w.shape:
                i = int((g != w).nonzero()[0])
                pos = int(want[1][i])
                end = " (the last position of a full block: the slot of a full block's last position is off by one)" \
                    if pos % B == B - 1 else ""
                return (f"slot_mapping[{i}] (position {pos}, block_size={B}) is {int(g[i])}, expected "
                        f"table[{pos} // {B}] * {B} + {pos % B} = {int(w[i])}{end}; slot_mapping {g.tolist()}, expected "
                        f"{w.tolist()}")
            if name == "context_lens":
                return (f"context_lens is {g.tolist()}, expected {w.tolist()}: c + n, the positions whose K/V exists "
                        f"after this forward (the cached ones and the new ones)")
            if name == "block_tables":
                return (f"block_tables is {g.tolist()}, expected {w.tolist()}: each sequence's table, padded with -1 "
                        f"to the longest one")
            return f"{name} is {g.tolist()}, expected {w.tolist()}"
    return None


def _as_tuple(got):
    """A ModelInputs (a NamedTuple: a handle through the sandbox, iterated there) as a plain tuple."""
    try:
        return tuple(got)
    except TypeError:
        return got


BATCH_CASES = ["decode-B4", "prefix-B4", "readmit-B5", "prefill-B1"]


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("name", BATCH_CASES)
def test_model_inputs_are_the_contracts_six_tensors(impl, gen, sv, name):
    """For each sequence in batch order, ``c = num_computed_tokens``, ``n = num_scheduled_tokens``: tokens
    ``token_ids[c:c+n]`` at positions ``c..c+n-1``, slot ``table[p // B] * B + p % B`` (the partial
    last block included), ``query_start_loc`` the running totals, ``context_lens = c + n``, the tables
    padded with -1 to the longest; six int64 CPU tensors."""
    B, rows = _batch_case(gen, name)
    batch = [_seq(impl, 10 + i, p, o, c, n) for i, (p, o, c, n, _) in enumerate(rows)]
    got = _as_tuple(impl.build_model_inputs(batch, [t for *_, t in rows], B))
    problem = _inputs_problem(got, _want_inputs(sv, B, rows), B, rows)
    assert problem is None, f"{problem} (batch {name})"


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_model_inputs_refuse_an_empty_or_inconsistent_batch(impl, gen, sv):
    """ValueError for an empty batch, ``len(block_tables) != len(batch)``, ``n < 1``, and a table that
    does not reach position ``c + n - 1`` (naming the seq_id); the valid neighbour (the same batch
    with a table that reaches it) gives the contract's tensors."""
    B = 4
    rows = [(_tokens(gen, 6), _tokens(gen, 3), 8, 1, [5, 2, 7]), (_tokens(gen, 9), [], 0, 9, [4, 1, 0])]
    batch = [_seq(impl, 30 + i, p, o, c, n) for i, (p, o, c, n, _) in enumerate(rows)]
    got = _as_tuple(impl.build_model_inputs(batch, [t for *_, t in rows], B))
    problem = _inputs_problem(got, _want_inputs(sv, B, rows), B, rows)
    assert problem is None, f"{problem} (the valid neighbour of the refusals)"
    expect_raises(ValueError, "build_model_inputs([], [], 4)", impl.build_model_inputs, [], [], B)
    expect_raises(ValueError, "build_model_inputs of 2 sequences with 1 table", impl.build_model_inputs, batch,
                  [rows[0][4]], B)
    e = expect_raises(ValueError, "build_model_inputs where seq 31's table of 2 blocks ends before position 8",
                      impl.build_model_inputs, batch, [rows[0][4], [4, 1]], B)
    assert "31" in str(e), f"the ValueError for a table too short must name the seq_id 31: {e}"
    idle = _seq(impl, 40, _tokens(gen, 3), [], 3, 0)
    expect_raises(ValueError, "build_model_inputs of a sequence with num_scheduled_tokens=0",
                  impl.build_model_inputs, [idle], [[3]], B)


# --- the engine ---------------------------------------------------------------------------------------

def _requests(sv, oracle, gen, lengths, max_new):
    """Prompts (lengths cycling through ``lengths``) whose decoding alone keeps a gap >= 1e-6."""
    got = sv.prompts_with_gap(oracle, gen, len(max_new), lengths, max(max_new))
    return [(p, n, toks[:n]) for (p, toks), n in zip(got, max_new)]


def _oracle(sv, impl, seed):
    model = impl.TinyLM(None, seed)
    return sv.Oracle(model.state_dict(), sv.CFG)


ENGINE_CASES = {
    # name: (block_size, num_blocks, max_num_seqs, max_num_batched_tokens, prompt lengths, max_new, arrival steps)
    "B4-staggered": (4, 48, 3, 64, [5, 11, 2, 8, 13], [6, 3, 7, 4, 5], [0, 0, 2, 3, 3]),
    "B1": (1, 96, 4, 64, [4, 7, 3], [5, 6, 4], [0, 1, 1]),
    "B16-eos": (16, 8, 4, 64, [9, 17, 5, 12], [8, 6, 7, 5], [0, 0, 1, 4]),
    "B3-preempting": (3, 9, 4, 64, [7, 8, 6, 5], [9, 8, 9, 7], [0, 0, 1, 1]),
    "B4-shared-prefix": (4, 40, 4, 64, [3, 6, 5, 2], [5, 4, 6, 3], [0, 1, 3, 3]),
}


@pytest.mark.part("C")
@pytest.mark.points(3)
@pytest.mark.parametrize("name", list(ENGINE_CASES))
def test_steps_follow_the_schedule_and_fill_the_pool(impl, gen, seed, sv, name):
    """``step()``: schedule, the batch's inputs, ONE call ``model(inputs, kv_cache)`` with the engine's
    pool, the argmax of each row, postprocess; it returns ``(seq_id, token)`` for the batch. After
    every step the return and the whole K/V pool (every written slot: the K/V of the right token at
    the right position, all layers) equal the replay's, whatever the block size, pool pressure
    (preemption and recomputation), EOS, arrivals and prefix sharing; every request finishes."""
    B, nb, ms, mt, lengths, max_new, arrive = ENGINE_CASES[name]
    oracle = _oracle(sv, impl, seed)
    reqs = _requests(sv, oracle, gen, lengths, max_new)
    eos = None
    if name == "B16-eos":
        eos = reqs[0][2][2]           # request 0 stops at its third token
    if name == "B4-shared-prefix":
        prefix = reqs[0][0] + _tokens(gen, 6)
        reqs = [(prefix[:len(prefix) - k] + p, n, None) for k, (p, n, _) in zip([0, 0, 1, 4], reqs)]
    arrivals = {}
    for (p, n, _), at in zip(reqs, arrive):
        arrivals.setdefault(at, []).append((p, n, eos))

    def alone(r):                      # grader self-check: the contract's replay is decoding alone
        if r.mode == "contract" and r.broke is None:
            for sid, req in r.reqs.items():
                want, _ = r.oracle.greedy(req.prompt, req.max_new_tokens, eos)
                assert req.output == want, f"grader defect: the replay of request {sid} is not its decoding alone"
    r, _ = sv.replay(sv, impl, (None, seed), sv.CFG, nb, B, ms, mt, arrivals, after=alone)
    if name == "B3-preempting" and r.mode == "contract":
        assert any("preempt" in x for x in r.log) or r.sched is not None


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_argmax_ties_go_to_the_lowest_token_id(impl, gen, seed, sv):
    """Two rows of the model's head made equal tie their logits exactly: ``step()`` picks the lower
    token id (``torch.argmax`` does)."""
    model = impl.TinyLM(None, seed)
    state = model.state_dict()
    oracle = sv.Oracle(state, sv.CFG)
    (p, toks), = sv.prompts_with_gap(oracle, gen, 1, [6], 4)
    first = toks[0]
    other = int(torch.randint(0, V - 1, (1,), generator=gen))
    other += other >= first
    head = state["lm_head"].clone()
    head[other] = head[first]         # ties at the first step: the lower of first and other must win
    state = dict(state, lm_head=head)
    arrivals = {0: [(p, 4, None), (_tokens(gen, 3), 3, None)]}
    sv.replay(sv, impl, (None, seed), sv.CFG, 24, 4, 4, 64, arrivals, strict_ties=True, state=state)


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_generate_returns_outputs_in_prompt_order(impl, gen, seed, sv):
    """``generate(prompts, max_new_tokens)`` (a list of limits) adds every request, steps until
    nothing is unfinished and returns each prompt's output in PROMPT order, though the first
    prompt finishes last."""
    oracle = _oracle(sv, impl, seed)
    reqs = _requests(sv, oracle, gen, [4, 9, 6, 3], [7, 2, 4, 3])
    prompts, limits = [p for p, _, _ in reqs], [n for _, n, _ in reqs]
    want = [t for _, _, t in reqs]
    model = impl.TinyLM(None, seed)
    engine = impl.LLMEngine(model, 32, 4, max_num_seqs=2, max_num_batched_tokens=32)
    model.forward_dense = None
    model.new_kv_cache = None
    got, err = _call(engine.generate, prompts, limits)
    if _follows(sv, impl, oracle, (32, 4, 2, 32), prompts, limits, got, err, engine):
        return
    if isinstance(got, list) and sorted(map(tuple, got)) == sorted(map(tuple, want)):
        raise AssertionError(f"generate must return the outputs in prompt order: got {got}, expected {want} (the "
                             f"order requests finish in is not the order they were given)")
    raise AssertionError(f"generate returned {got if err is None else repr(err)}, expected each prompt decoded "
                         f"alone: {want}")


def _call(fn, *args):
    """``(value, None)`` or ``(None, the exception)``."""
    try:
        out = fn(*args)
        return ([list(x) for x in out] if isinstance(out, (list, tuple)) else out), None
    except Exception as e:  # noqa: BLE001 - judged by _follows
        return None, e


def _follows(sv, impl, oracle, config, prompts, limits, got, err, engine):
    """Whether ``generate``'s result (``got`` or the exception ``err``) and the engine's K/V pool
    afterwards are the contract's (``_contract_run``), or what the submission's own Scheduler,
    BlockManager and build_model_inputs give with the oracle as the model (their bugs are graded in
    parts A, B and by the build_model_inputs tests): the same outputs and pool, or the same
    exception after at least one model step. The pool shows the model served the requests: outputs
    taken from anywhere else leave it empty."""
    kv = engine.kv_cache if err is None else None

    def same_pool(pool):
        return isinstance(kv, torch.Tensor) and kv.shape == pool.shape and \
            torch.allclose(kv.to(torch.float64), pool, atol=1e-9, rtol=0)
    outs, pool = _contract_run(sv, oracle, *config, prompts, limits)
    if err is None and got == outs and same_pool(pool):
        return True
    for mine in (False, True):
        outs, pool, exc, steps = _twin_outputs(sv, impl, oracle, *config, prompts, limits, mine)
        if err is None and outs is not None and got == outs and same_pool(pool):
            return True
        if err is not None and exc is not None and steps >= 1 and sv.same_error(err, exc):
            return True
    return False


def _contract_run(sv, oracle, nb, B, ms, mt, prompts, limits):
    """``(outputs, final K/V pool)`` of the contract (the graders' BlockManager and scheduler) with the
    oracle as the model."""
    sched = sv.ContractScheduler(sv.RefBlockManager(nb, B), ms, mt)
    reqs = [sv.Req(i, p, n) for i, (p, n) in enumerate(zip(prompts, limits))]
    for r in reqs:
        sched.add(r)
    pool = oracle.new_pool(nb, B)
    while sched.has_unfinished():
        batch = sched.schedule()
        fields = [{"num_computed_tokens": r.num_computed_tokens, "num_scheduled_tokens": r.num_scheduled_tokens,
                   "token_ids": r.token_ids} for r in batch]
        logits = oracle.forward(sv.contract_inputs(fields, [sched.bm.block_table(r.seq_id) for r in batch], B), pool)
        sched.postprocess(batch, [sv.pick(row)[0] for row in logits])
    return [r.output for r in reqs], pool


def _twin_outputs(sv, impl, oracle, nb, B, ms, mt, prompts, limits, student_inputs):
    """``(outputs, final pool, exception, model steps)`` of the submission's own Scheduler and
    BlockManager with the oracle as the model, its inputs built by the graders or (``student_inputs``)
    by the submission's ``build_model_inputs``."""
    bulk = sv.bulk(impl)
    steps = 0
    try:
        tbm = impl.BlockManager(nb, B)
        ts = sv.Methods(impl.Scheduler(tbm, ms, mt))
        twins = [impl.Sequence(i, list(p), n) for i, (p, n) in enumerate(zip(prompts, limits))]
        for t in twins:
            ts.add(t)
        pool = oracle.new_pool(nb, B)
        for _ in range(500):
            if not bool(ts.has_unfinished()):
                break
            batch = list(ts.schedule())
            if not batch:
                continue
            fields = bulk.attrs(batch, ["seq_id", "num_computed_tokens", "num_scheduled_tokens", "token_ids"])
            tables = [list(tbm.block_table(f["seq_id"])) for f in fields]
            inputs = tuple(t.to(torch.int64) for t in impl.build_model_inputs(batch, tables, B)) if student_inputs \
                else sv.contract_inputs(fields, tables, B)
            logits = oracle.forward(inputs, pool)
            steps += 1
            ts.postprocess(batch, [sv.pick(row)[0] for row in logits])
        return [list(t.output) for t in twins], pool, None, steps
    except Exception as e:  # noqa: BLE001 - the submission's parts raised
        return None, None, e, steps


@pytest.mark.part("C")
def test_an_idle_step_calls_no_model(impl, gen, seed, sv):
    """With nothing waiting or running, ``step()`` returns ``[]`` without calling the model (the
    graders disable ``model.forward`` after a finished trace, whose steps were checked first), and
    ``has_unfinished()`` is False."""
    oracle = _oracle(sv, impl, seed)
    reqs = _requests(sv, oracle, gen, [5, 3], [3, 4])

    def idle(r):
        if r.broke is not None:        # the submission's own parts raised: graded elsewhere, no idle engine here
            return
        r.model.forward = None
        for _ in range(2):
            try:
                got = r.e.step()
            except Exception as e:  # noqa: BLE001 - a disabled model or an empty batch refused
                raise AssertionError(f"an idle step called the model (or built inputs for an empty batch): step() "
                                     f"with nothing to run raised {type(e).__name__}: {e}") from None
            assert list(got) == [], f"an idle step returned {got!r}, expected []"
        assert not bool(r.e.has_unfinished()), "has_unfinished() must be False once every request finished"
    sv.replay(sv, impl, (None, seed), sv.CFG, 16, 4, 4, 64, {0: [(p, n, None) for p, n, _ in reqs]}, after=idle)


@pytest.mark.part("C")
@pytest.mark.points(2)
def test_add_request_refuses_bad_requests_and_they_take_no_id(impl, gen, seed, sv):
    """``add_request``: TypeError for a prompt that is not a list of ints; ValueError for an empty
    prompt, a token outside the vocabulary (naming it), ``max_new_tokens < 1``, an EOS outside the
    vocabulary, ``len(prompt) + max_new_tokens > max_seq_len`` (naming it) and the
    ``Scheduler.add`` errors (naming ``max_num_batched_tokens`` / ``num_blocks``). The valid
    neighbour: the next valid request gets id 0 and is served (its steps checked)."""
    oracle = _oracle(sv, impl, seed)
    (p, n, _), = _requests(sv, oracle, gen, [6], [4])

    def refusals(r):
        add = r.e.add_request
        for exc, label, args, name in (
                (TypeError, "a str prompt", ("abc", 3), None),
                (TypeError, "a prompt of floats", ([1.5, 2.0], 3), None),
                (ValueError, "an empty prompt", ([], 3), None),
                (ValueError, "a token 64 outside the vocabulary of 64", ([3, 64, 5], 3), "64"),
                (ValueError, "max_new_tokens=0", ([3, 4], 0), None),
                (ValueError, "eos_token_id=70 outside the vocabulary", ([3, 4], 2, 70), None),
                (ValueError, "a prompt of 250 + 7 new tokens > max_seq_len=256", (_tokens(gen, 250), 7), "max_seq_len"),
                (ValueError, "a prompt of 60 + 6 new: K = 65 > max_num_batched_tokens=64", (_tokens(gen, 60), 6),
                 "max_num_batched_tokens")):
            e = expect_raises(exc, f"add_request with {label}", add, *args)
            if name:
                assert name in str(e), f"add_request with {label}: the error must name {name}: {e}"
        e = expect_raises(ValueError, "add_request with K = 45 + 5 - 1 = 49 needing 13 blocks of 4 > num_blocks=12",
                          add, _tokens(gen, 45), 5)
        assert "num_blocks" in str(e), f"add_request needing more blocks than the pool: the error must name num_blocks: {e}"
    sv.replay(sv, impl, (None, seed), sv.CFG, 12, 4, 4, 64, {0: [(p, n, None)]}, before=refusals)


@pytest.mark.part("C")
def test_generate_adds_no_request_when_one_is_invalid(impl, gen, seed, sv):
    """``generate`` validates every request before adding any: with one bad prompt it raises and the
    engine holds no request; then a valid ``generate`` gets ids from 0 and each prompt's output."""
    oracle = _oracle(sv, impl, seed)
    reqs = _requests(sv, oracle, gen, [5, 4], [3, 3])
    model = impl.TinyLM(None, seed)
    engine = impl.LLMEngine(model, 16, 4, max_num_seqs=4, max_num_batched_tokens=64)
    expect_raises(ValueError, "generate of a valid prompt and one with token 99", engine.generate,
                  [reqs[0][0], [1, 99]], 3)
    held = engine.sequences
    assert len(held) == 0 and not bool(engine.has_unfinished()), \
        f"generate must validate every request first: after a refused generate the engine holds {len(held)} request(s)"
    prompts, want = [p for p, _, _ in reqs], [t for _, _, t in reqs]
    model.forward_dense = None
    model.new_kv_cache = None
    got, err = _call(engine.generate, prompts, 3)
    if not _follows(sv, impl, oracle, (16, 4, 4, 64), prompts, [3, 3], got, err, engine):
        raise AssertionError(f"generate after a refused one returned {got if err is None else repr(err)}, "
                             f"expected {want}")
    if err is None:
        assert sorted(engine.sequences) == [0, 1], f"the ids after a refused generate are {sorted(engine.sequences)}, " \
            f"expected [0, 1] (no request was added by the refused call)"


# --- throughput: continuous against static batching ------------------------------------------------------

def _perf_requests(gen, n, lengths, new, V):
    prompts = [torch.randint(0, V, (int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in range(n)]
    limits = [int(torch.randint(new[0], new[1] + 1, (1,), generator=gen)) for _ in range(n)]
    return prompts, limits


def _throughput(impl, gen, seed, sv, device, cfg, dtype, n, lengths, new, engine_kw, check_values, edges):
    cfg_h = impl.ModelConfig(**cfg)
    model = impl.TinyLM(cfg_h, seed, dtype, device)
    engine = impl.LLMEngine(model, **engine_kw)
    static = impl.torch.functools.partial(impl.static_generate, model)   # static_generate(model, prompts, limits)
    pool = [_perf_requests(gen, n, lengths, new, cfg["vocab_size"]) for _ in range(13)]
    oracle = sv.Oracle(model.state_dict(), {**sv.CFG, **cfg}) if check_values else None

    def check(i, out):
        prompts, limits = pool[i]
        assert isinstance(out, list) and len(out) == len(prompts), "a timed generate returned the wrong number of outputs"
        for p, k, o in zip(prompts, limits, out):
            assert len(o) == k, f"a timed generate's output has {len(o)} tokens, max_new_tokens={k}: no performance credit"
            bad = oracle.follows_greedy(p, list(o)) if oracle is not None else None
            assert bad is None, (f"a timed generate's output is not the prompt decoded alone (token {bad} of {k} is "
                                 f"not the argmax): no performance credit")
    return timed(engine.generate, static, pool[:10], warmup_inputs=pool[10:], check=check, edges=edges,
                 baseline_kwargs={"batch_size": engine_kw["max_num_seqs"], "block_size": engine_kw["block_size"]},
                 device=device)


GPU_CFG = dict(vocab_size=1024, d_model=512, n_layers=4, n_heads=8, n_kv_heads=4, ffn_hidden=1408, max_seq_len=512)


@pytest.mark.gpu
@pytest.mark.perf("serving_vs_static")
@pytest.mark.part("C")
def test_gpu_throughput_against_static_batching(impl, gen, seed, sv, lab, record_perf):
    """Generated tokens per second of ``LLMEngine.generate`` against ``static_generate`` (groups of
    max_num_seqs = 16) on the same float32 TinyLM on CUDA (d_model 512, 4 layers), 32 requests of
    16..96 prompt tokens and 8..96 new tokens, timed in one process, interleaved (harness.bench);
    outputs checked for length only (float32 batching may flip near ties)."""
    threshold = lab.perf["serving_vs_static"]
    t = _throughput(impl, gen, seed, sv, "cuda", GPU_CFG, torch.float32, 32, (16, 96), (8, 96),
                    dict(num_blocks=512, block_size=16, max_num_seqs=16, max_num_batched_tokens=2048), False,
                    threshold.edges())
    figures = {"engine_s": t.candidate_s, "static_s": t.baseline_s, "outside": str(t.outside)}
    assert t.ratio < threshold.zero_credit, (
        f"LLMEngine.generate takes {t.ratio:.3g}x the time of static batching; no performance credit at >= "
        f"{threshold.zero_credit}x, full credit at <= {threshold.full_credit}x ({figures})")
    record_perf("serving_vs_static", t.ratio, **figures)


@pytest.mark.perf("serving_vs_static_cpu")
@pytest.mark.part("C")
def test_cpu_time_against_static_batching(impl, gen, seed, sv, lab, record_perf):
    """The same pair on CPU, CPU time, one thread: 10 requests (2..8 prompt tokens, 1..16 new tokens)
    on the float64 TinyLM, max_num_seqs = 4, B = 4; every timed output equals its prompt decoded
    alone (float64)."""
    threshold = lab.perf["serving_vs_static_cpu"]
    t = _throughput(impl, gen, seed, sv, "cpu", sv.CFG, torch.float64, 10, (2, 8), (1, 16),
                    dict(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=64), True,
                    threshold.edges())
    figures = {"engine_ms": t.candidate_s * 1e3, "static_ms": t.baseline_s * 1e3, "outside": str(t.outside)}
    assert t.ratio < threshold.zero_credit, (
        f"LLMEngine.generate takes {t.ratio:.3g}x the CPU time of static batching; no performance credit at >= "
        f"{threshold.zero_credit}x, full credit at <= {threshold.full_credit}x ({figures})")
    record_perf("serving_vs_static_cpu", t.ratio, **figures)
