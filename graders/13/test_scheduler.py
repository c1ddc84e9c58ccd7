"""Hidden graders for lab 13, Part B: the Scheduler.

Each trace runs the submission's ``Scheduler`` over its own ``BlockManager`` beside the
contract's scheduler (``sv.ContractScheduler``) over a twin ``BlockManager`` of the
submission (so Part A's bugs never cost Part B points), with the same requests and the
same tokens ("the model" is a plan of tokens per request: no model runs here). Each test
grades one property on a trace where the others cannot matter:

- continuous batching (max_num_seqs binds; pool and token budget ample, no shared prefix);
- admission in order into the token budget, stopping at the first request that does not
  fit (budget or pool binds; no decode ever runs out of blocks);
- prefix hits not recomputed (shared prefixes; budget and pool ample);
- preemption by recomputation (a small pool; no shared prefix, budget ample);
- finished requests leave at once (every request admitted in the first step);
- the refusals of ``Scheduler(...)``, ``add`` and ``postprocess``, after their valid neighbours.

Prompts and tokens come from the run seed; trace shapes are designed (and checked here
against the graders' own BlockManager, so a trace is what its test says it is).
"""
from __future__ import annotations

import pytest
import torch

from harness.toolkit import expect_raises

V = 64


def _tokens(gen, n):
    return torch.randint(0, V, (n,), generator=gen).tolist()


def _plans(gen, outs, eos=None):
    """Token plans of the given lengths, avoiding ``eos`` (placed by the caller where wanted)."""
    plans = []
    for n in outs:
        p = _tokens(gen, n)
        plans.append([t if t != eos else (t + 1) % V for t in p])
    return plans


def _trace(sv, impl, nb, B, ms, mt, compare, gen=None):
    first = bool(torch.randint(0, 2, (1,), generator=gen)) if gen is not None else False
    return sv.SchedTrace(impl, sv.bulk(impl), nb, B, ms, mt, compare, twin_first=first)


def _self_check(sv, nb, B, ms, mt, arrivals, preempts=None):
    """Run the contract on the graders' own BlockManager: the trace must be what the test says."""
    bm = sv.RefBlockManager(nb, B)
    sc = sv.ContractScheduler(bm, ms, mt)
    step, pre = 0, 0
    reqs = {}
    while True:
        for sid, prompt, plan, eos in arrivals.get(step, []):
            reqs[sid] = sv.Req(sid, prompt, len(plan), eos)
            sc.add(reqs[sid])
        if not sc.has_unfinished() and step >= max(arrivals):
            break
        batch = sc.schedule()
        pre += len(sc.preempted)
        sc.postprocess(batch, [reqs[r.seq_id] and plan_of(arrivals, r.seq_id)[len(r.output)] for r in batch])
        step += 1
        assert step < 500
    if preempts is not None:
        assert (pre > 0) == preempts, f"grader defect: the trace {'does not preempt' if preempts else 'preempts'}"
    return step, sc


def plan_of(arrivals, sid):
    return next(a[2] for xs in arrivals.values() for a in xs if a[0] == sid)


# --- continuous batching ------------------------------------------------------------------------

OUTS_8 = [3, 12, 9, 2, 4, 10, 4, 3]   # static batching in groups of 4: 12 + 10 = 22 model calls


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("case", ["8-at-once", "arriving"])
def test_requests_join_a_running_batch(impl, gen, sv, case):
    """Iteration-level scheduling: a waiting request joins the running batch in the first step it
    fits, beside the decodes (pool ample, no shared prefix). "8-at-once": 8 requests, max_num_seqs = 4,
    B = 4: the trace takes 13 steps where static batching's groups of 4 take 22 model calls (the
    contract's example). "arriving": requests arriving while others decode, max_num_seqs = 3, B = 5,
    a token budget the decode tokens count against."""
    if case == "8-at-once":
        lens = torch.randint(3, 15, (8,), generator=gen).tolist()
        arrivals = {0: [(i, _tokens(gen, lens[i]), plan, None) for i, plan in enumerate(_plans(gen, OUTS_8))]}
        nb, B, ms, mt = 64, 4, 4, 64
    else:
        lens = torch.randint(2, 9, (6,), generator=gen).tolist()
        plans = _plans(gen, [6, 2, 5, 7, 3, 4])
        at = {0: [0], 2: [1, 2], 3: [3], 5: [4, 5]}
        arrivals = {s: [(i, _tokens(gen, lens[i]), plans[i], None) for i in ids] for s, ids in at.items()}
        nb, B, ms, mt = 48, 5, 3, 14
    steps, _ = _self_check(sv, nb, B, ms, mt, arrivals, preempts=False)
    tr = _trace(sv, impl, nb, B, ms, mt, ["batch", "queues"], gen)
    got = tr.run(arrivals)
    if case == "8-at-once" and tr.broke is None:
        static = sum(max(OUTS_8[i:i + 4]) for i in range(0, 8, 4))
        assert got == steps == 13 and got < static, f"continuous batching: {got} steps, expected 13 (static: {static})"


# --- admission: in order, into the token budget -------------------------------------------------

ADMISSION_TRACES = {
    # name: (num_blocks, max_num_batched_tokens, prompt lengths, outputs, arrival steps, shares a 12-token prefix)
    # budget 19: admissions stop at the first request whose new tokens exceed what is left
    "budget": (64, 19, [7, 1, 15, 7], [2, 2, 1, 4], [0, 0, 2, 2], None),
    # budget 15: seq 2 (13 tokens, 12 of them cached) computes 1 token beside seq 1's 4
    "budget-cached": (64, 15, [14, 4, 13], [1, 4, 2], [0, 2, 2], [True, False, True]),
    # 5 blocks: seq 2 (14 tokens, 4 blocks) does not fit beside seqs 0 and 1; seq 3 would, and waits
    "pool": (5, 64, [6, 5, 14, 10], [1, 3, 1, 3], [0, 0, 0, 1], None),
}


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("case", list(ADMISSION_TRACES))
def test_admission_stops_at_the_first_request_that_does_not_fit(impl, gen, sv, case):
    """Admission takes the waiting requests in order while ``decode tokens + new tokens <=
    max_num_batched_tokens`` (``new`` counts only the tokens after a cached prefix) and the pool can
    hold them, and stops at the first that does not fit, even when a later one would (head-of-line
    blocking); it allocates only what it admits. In these traces every admission finds an empty
    running batch (static and continuous batching agree) and no decode runs out of blocks."""
    nb, mt, lens, outs, at, shared = ADMISSION_TRACES[case]
    prefix = _tokens(gen, 12)
    prompts = [prefix + _tokens(gen, n - 12) if shared and shared[i] else _tokens(gen, n) for i, n in enumerate(lens)]
    plans = _plans(gen, outs)
    arrivals = {}
    for i, s in enumerate(at):
        arrivals.setdefault(s, []).append((i, prompts[i], plans[i], None))
    _self_check(sv, nb, 4, 4, mt, arrivals, preempts=False)
    tr = _trace(sv, impl, nb, 4, 4, mt, ["batch", "queues", "pool"], gen)
    tr.run(arrivals)


# --- prefix hits ----------------------------------------------------------------------------------

@pytest.mark.part("B")
@pytest.mark.points(3)
def test_prefix_hits_are_not_recomputed(impl, gen, sv):
    """Six prompts sharing a 9-token prefix (B = 4: two full blocks): the first computes it; two
    admitted together hit its blocks (free now, still cached); a second wave of three after they
    finished; then a prompt whose every full block is cached (it still computes its last block).
    An admitted request's ``num_computed_tokens`` is its cached prefix, ``num_scheduled_tokens`` the
    rest; the tokens computed over the trace are the contract's count, at least 32 below the count
    without a cache. Every admission finds an empty running batch."""
    prefix = _tokens(gen, 9)
    p = [prefix + _tokens(gen, n) for n in (3, 5, 2, 4, 6, 1)]
    plans = _plans(gen, [1, 3, 5, 2, 3, 4, 3])
    arrivals = {0: [(0, p[0], plans[0], None)],
                1: [(1, p[1], plans[1], None), (2, p[2], plans[2], None)],
                6: [(3, p[3], plans[3], None), (4, p[4], plans[4], None), (5, p[5], plans[5], None)],
                10: [(6, p[0][:12], plans[6], None)]}
    _, ref = _self_check(sv, 64, 4, 4, 64, arrivals, preempts=False)
    no_cache = sum(len(pr) for xs in arrivals.values() for _, pr, _, _ in xs) + \
        sum(len(plan) - 1 for xs in arrivals.values() for _, _, plan, _ in xs)
    assert ref.computed <= no_cache - 32, f"grader defect: {ref.computed} tokens computed, {no_cache} without a cache"
    tr = _trace(sv, impl, 64, 4, 4, 64, ["batch", "fields"], gen)
    tr.run(arrivals)


# --- preemption -----------------------------------------------------------------------------------

PREEMPTION_TRACES = {
    # four 1-block prompts fill a 4-block pool: the first decode that needs a block preempts seq 3,
    # the next seq 2 (two victims in one step; waiting [2, 3]); later seq 0 preempts seq 1
    "two-victims": (4, [4, 4, 4, 4], [10, 9, 6, 5]),
    # seqs 0 and 1 identical (seq 0's blocks become the cache entries), seq 2 longer, a 5-block pool:
    # when seq 1 preempts itself its readmission would fit at once on seq 0's blocks, but a step
    # that preempted admits nobody; later seq 2 and seq 1 are preempted in turn
    "duplicates": (5, [4, 4, 5], [6, 6, 9]),
}


@pytest.mark.part("B")
@pytest.mark.points(4)
@pytest.mark.parametrize("name", list(PREEMPTION_TRACES))
def test_preemption_by_recomputation(impl, gen, sv, name):
    """A decode that finds no free block preempts the LAST running sequence (the most recently
    admitted, possibly itself: then the decode phase ends): its blocks are freed, its output kept,
    ``num_computed_tokens`` reset to 0, and it goes to the FRONT of waiting; a step that preempted
    admits nobody; the readmitted request recomputes prompt + output. Every request arrives in the
    first step and fits then; readmissions find an empty running batch or the head of waiting."""
    nb, lens, outs = PREEMPTION_TRACES[name]
    plans = _plans(gen, outs)
    prompts = [_tokens(gen, n) for n in lens]
    if name == "duplicates":
        prompts[1], plans[1] = list(prompts[0]), list(plans[0])
    arrivals = {0: [(i, prompts[i], plans[i], None) for i in range(len(lens))]}
    _self_check(sv, nb, 4, 4, 64, arrivals, preempts=True)
    tr = _trace(sv, impl, nb, 4, 4, 64, ["batch", "queues", "waiting_fields"], gen)
    tr.run(arrivals)


# --- retirement -----------------------------------------------------------------------------------

@pytest.mark.part("B")
@pytest.mark.points(2)
def test_finished_requests_leave_at_once(impl, gen, sv):
    """Every request is admitted in the first step; they finish at different steps, one at its EOS
    token: ``postprocess`` marks a request finished when it emits EOS or reaches max_new_tokens,
    frees its blocks at once (before the next ``schedule()``) and removes it from ``running``."""
    eos = int(torch.randint(0, V, (1,), generator=gen))
    plans = _plans(gen, [3, 6, 5, 5], eos=eos)
    plans[1][2] = eos                    # seq 1 stops at its third token (EOS kept), before max_new_tokens=6
    lens = [7, 5, 9, 3]
    arrivals = {0: [(i, _tokens(gen, lens[i]), plans[i], eos) for i in range(4)]}
    _self_check(sv, 40, 4, 4, 64, arrivals, preempts=False)
    tr = _trace(sv, impl, 40, 4, 4, 64, ["batch", "after"], gen)
    tr.run(arrivals)
    if tr.broke is not None:
        return
    outs = tr.bulk.attrs([tr.handles[i] for i in range(4)], ["output", "status"])
    want = [(r.output, r.status) for r in tr.reqs.values()]
    got = [(o["output"], o["status"]) for o in outs]
    assert got == want, f"outputs and statuses {got}, expected {want} (EOS={eos} is kept as the last token)"


# --- refusals, after their valid neighbours -------------------------------------------------------

@pytest.mark.part("B")
def test_scheduler_refuses_limits_and_requests_it_could_never_run(impl, gen, sv):
    """``Scheduler(bm, max_num_seqs, max_num_batched_tokens)``: ValueError naming ``max_num_seqs`` if
    < 1, ``max_num_batched_tokens`` if < max_num_seqs. ``add``: a request that can need
    ``K = len(prompt) + max_new_tokens - 1`` slots is refused (ValueError naming
    ``max_num_batched_tokens`` if K > it, ``num_blocks`` if ceil(K / B) > num_blocks), equality
    accepted and scheduled whole in one step; a refused add changes nothing."""
    bm = impl.BlockManager(3, 5)
    sched = impl.Scheduler(bm, 2, 14)    # K = 14 fits both limits exactly (3 blocks of 5 hold 15)
    ok = impl.Sequence(7, _tokens(gen, 11), 4)
    sched.add(ok)
    batch = sched.schedule()
    got = [(s.seq_id, s.num_computed_tokens, s.num_scheduled_tokens) for s in batch]
    assert got == [(7, 0, 11)], f"a request with K == max_num_batched_tokens == 14 must be admitted whole: {got}"
    for label, kw, name in (("max_num_seqs=0", (0, 8), "max_num_seqs"),
                            ("max_num_batched_tokens=3 < max_num_seqs=4", (4, 3), "max_num_batched_tokens")):
        e = expect_raises(ValueError, f"Scheduler(bm, {label})", impl.Scheduler, impl.BlockManager(4, 4), *kw)
        assert name in str(e), f"Scheduler(bm, {label}) must name {name}: {e}"
    other = impl.Scheduler(impl.BlockManager(3, 5), 2, 14)
    for label, seq, name in (("K = 12 + 4 - 1 = 15 > max_num_batched_tokens=14", impl.Sequence(1, _tokens(gen, 12), 4),
                              "max_num_batched_tokens"),):
        e = expect_raises(ValueError, f"add of a request with {label}", other.add, seq)
        assert name in str(e), f"add of a request with {label} must name {name}: {e}"
    small = impl.Scheduler(impl.BlockManager(2, 5), 2, 14)
    e = expect_raises(ValueError, "add of a request with K = 11 needing 3 blocks of 5 > num_blocks=2", small.add,
                      impl.Sequence(2, _tokens(gen, 9), 3))
    assert "num_blocks" in str(e), f"add of a request needing 3 blocks > num_blocks=2 must name num_blocks: {e}"
    assert not bool(other.has_unfinished()) and not bool(small.has_unfinished()), \
        "a refused add must change nothing (the request is not waiting)"


@pytest.mark.part("B")
def test_postprocess_refuses_a_token_count_that_is_not_the_batch(impl, gen, sv):
    """``postprocess(batch, token_ids)`` appends one token per sequence (valid neighbour: a batch
    of two); ValueError if ``len(token_ids) != len(batch)``, changing nothing."""
    bm = impl.BlockManager(16, 4)
    sched = impl.Scheduler(bm, 4, 64)
    a, b = impl.Sequence(0, _tokens(gen, 5), 3), impl.Sequence(1, _tokens(gen, 6), 3)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    toks = _tokens(gen, 2)
    sched.postprocess(batch, toks)
    got = [(s.output, s.num_computed_tokens) for s in (a, b)]
    assert got == [([toks[0]], 5), ([toks[1]], 6)], f"postprocess: (output, num_computed_tokens) {got}"
    batch = sched.schedule()
    expect_raises(ValueError, "postprocess of a batch of 2 with 3 token_ids", sched.postprocess, batch,
                  _tokens(gen, 3))
    got = [(s.output, s.num_computed_tokens) for s in (a, b)]
    assert got == [([toks[0]], 5), ([toks[1]], 6)], f"a refused postprocess changed the sequences: {got}"
