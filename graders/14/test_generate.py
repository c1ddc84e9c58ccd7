"""Hidden graders for lab 14, Part B: ``SpecStats`` and ``speculative_generate``.

Every test runs the submission's loop over a pair of the harness's trusted ``TableModel`` s
(conftest; ``build_spec_models``), made next to the implementation, and reads the models' own log
of calls (``model_log``, ``spec_runs``: kept by the harness, not on the objects), never a figure the
submission reports (except in the test of ``SpecStats`` itself). At temperature 0 the graders
replay the contract's loop (draft proposals are the draft's argmax chain; a block accepts the
prefix matching the target's greedy chain), so the blocks, each call's cache length and the
tokens it is fed are known exactly. At temperature > 0 the output is graded statistically
(generators seeded 0..N-1, N >= 1500, L1 bound at delta = 1e-6).
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.toolkit import expect_raises, model_log, spec_runs


def _prompt(gen, V, L):
    return torch.randint(0, V, (1, L), generator=gen)


def _pair(sp, gen, V, max_len, draft_scale=1.0):
    return sp.Tables(gen, V, max_len, name="target"), sp.Tables(gen, V, max_len, scale=draft_scale, name="draft")


def _replay(tt, dt, prompt, gamma, new):
    """The contract's loop at temperature 0: ``[(N, proposals, n)]`` per block and the output."""
    seq, total, blocks = list(prompt), len(prompt) + new, []
    while len(seq) < total:
        N = len(seq)
        g = min(gamma, total - N - 1)
        props = []
        for _ in range(g):
            props.append(int(dt.next_logits(seq + props).argmax()))
        tl = tt.logits(seq + props)[N - 1:]                 # p_0 .. p_g
        n = 0
        while n < g and props[n] == int(tl[n].argmax()):
            n += 1
        blocks.append((N, props, n))
        seq += props[:n] + [int(tl[n].argmax())]
    return blocks, seq


def _run(impl, sp, tt, dt, prompt, gamma, new, keep_error=False, **kw):
    """``(output, stats, target log, draft log)``; with ``keep_error`` an exception the call raised comes back
    in place of the output (the logs up to it are graded first)."""
    target, draft = sp.models(impl, tt, dt)
    try:
        out, stats = impl.speculative_generate(target, draft, prompt, gamma, new, **kw)
    except Exception as e:  # noqa: BLE001 - judged after the logs
        if not keep_error:
            raise
        out, stats = e, None
    return out, stats, model_log(target), model_log(draft)


CASES = {  # name: (V, prompt length, gamma, max_new_tokens, draft: 1.0 a stranger, 0 close to the target, -1 the target)
    "L1-g1": (11, 1, 1, 7, 1.0),
    "L5-g3": (13, 5, 3, 11, 1.0),
    "L4-g4-close": (9, 4, 4, 17, 0.0),
    "L6-g2": (16, 6, 2, 9, 1.0),
    "L3-g2-same": (12, 3, 2, 10, -1.0),
}


def _case(sp, gen, name):
    V, L, gamma, new, scale = CASES[name]
    tt, dt = _pair(sp, gen, V, L + new + 3)
    if scale == 0:                        # a draft close to the target: long accepted runs, some rejections
        dt.W, dt.P, dt.S = tt.W + 0.3 * dt.W, tt.P.clone(), tt.S.clone()
    if scale < 0:                         # the target's own tables: every block accepts everything
        dt.W, dt.P, dt.S = tt.W.clone(), tt.P.clone(), tt.S.clone()
    return tt, dt, _prompt(gen, V, L), gamma, new


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("name", list(CASES))
def test_greedy_output_is_the_targets_greedy_decoding(impl, gen, sp, name):
    """Temperature 0: ``(1, L + max_new_tokens)`` int64, the prompt then the target's greedy decoding
    token for token, whatever the draft."""
    tt, dt, prompt, gamma, new = _case(sp, gen, name)
    out, _, _, _ = _run(impl, sp, tt, dt, prompt, gamma, new)
    want = prompt[0].tolist() + tt.greedy(prompt[0].tolist(), new)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64 and tuple(out.shape) == (1, len(want)), \
        f"output_ids must be (1, L + max_new_tokens) = (1, {len(want)}) int64, got " \
        f"{getattr(out, 'shape', type(out).__name__)} {getattr(out, 'dtype', '')}"
    got = out[0].tolist()
    if got != want:
        i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        raise AssertionError(f"at temperature 0 the output must equal the target's greedy decoding token for token "
                             f"(V={tt.V}, L={prompt.shape[1]}, gamma={gamma}, {new} new tokens): position {i} is "
                             f"{got[i]}, expected {want[i]}; got {got[prompt.shape[1]:]}, expected "
                             f"{want[prompt.shape[1]:]}")


def _check_log(log, blocks, seq, L, who, proposals_of, partial=False):
    """Every call of one model against the replay: an optional prefill call first (from an empty cache, at most
    the prompt's first L-1 tokens), then per block the contract's calls. ``partial``: the run raised, so the
    log may stop early (every call it holds is still checked)."""
    per_block = [proposals_of(N, props) for N, props, _ in blocks]      # [(stream, [end of each call's feed])]
    want_calls = sum(len(ends) for _, ends in per_block)
    if log and log[0][0] == 0 and 0 < len(log[0][1]) <= L - 1 and log[0][1] == seq[:len(log[0][1])]:
        log = log[1:]                                                    # a separate prefill
    if len(log) > want_calls or (len(log) < want_calls and not partial):
        kind = "one target call per block (after a full acceptance the bonus comes from the block's own call)" \
            if who == "target" else "gamma_b = min(gamma, tokens left - 1) draft calls per block, no separate " \
                                    "catch-up call"
        raise AssertionError(f"the {who} was called {len(log)} times after any prefill, the contract's loop calls it "
                             f"{want_calls} times: {kind}; blocks (N, gamma_b, accepted) "
                             f"{[(N, len(p), n) for N, p, n in blocks]}")
    i = 0
    for b, ((stream, ends), (N, props, n)) in enumerate(zip(per_block, blocks)):
        for end in ends:
            if i == len(log):
                return
            s, f = log[i]
            i += 1
            if b > 0 and who == "target" and s != N - 1:
                raise AssertionError(f"KV cache not rolled back to the accepted length: the target's call of block {b} "
                                     f"found seq_len {s}, expected N - 1 = {N - 1} (N = {N} tokens emitted; crop the "
                                     f"target cache to the emitted sequence minus its last token after each block)")
            if s + len(f) != end or f != stream[s:end]:
                raise AssertionError(f"the {who}'s call in block {b} (seq_len {s}) was fed {f}, expected {stream[s:end]}"
                                     f": every call must feed the emitted sequence plus the block's proposals its cache "
                                     f"lacks (KV cache rolled back to the accepted length; N = {N}, proposals {props})")


@pytest.mark.part("B")
@pytest.mark.points(4)
@pytest.mark.parametrize("name", ["L5-g3", "L4-g4-close", "L3-g2-same"])
def test_every_call_feeds_what_its_rolled_back_cache_lacks(impl, gen, sp, name):
    """The log of calls replayed against the contract's loop at temperature 0: per block gamma_b =
    min(gamma, left - 1) draft calls then ONE target call; every target call after the first finds
    ``seq_len = N - 1``; every call is fed the emitted sequence plus the block's proposals its cache
    lacks (one optional prefill call per model)."""
    tt, dt, prompt, gamma, new = _case(sp, gen, name)
    out, _, tlog, dlog = _run(impl, sp, tt, dt, prompt, gamma, new, keep_error=True)
    blocks, seq = _replay(tt, dt, prompt[0].tolist(), gamma, new)
    L, err = prompt.shape[1], out if isinstance(out, Exception) else None
    _check_log(tlog, blocks, seq, L, "target", lambda N, props: (seq[:N] + props, [N + len(props)]), err is not None)
    _check_log(dlog, blocks, seq, L, "draft", lambda N, props: (seq[:N] + props, [N + c for c in range(len(props))]),
               err is not None)
    if err is not None:
        raise err


@pytest.mark.part("B")
@pytest.mark.points(4)
def test_call_and_position_counts_stay_in_the_contracts_bounds(impl, gen, sp):
    """From the models' logs: ``blocks <= target_calls <= blocks + 1``; ``proposed <= draft_calls <=
    proposed + 1``; target positions ``= L - 1 + proposed + blocks``; draft positions ``<= L + proposed
    + blocks``; ``accepted + blocks = max_new_tokens``."""
    tt, dt, prompt, gamma, new = _case(sp, gen, "L6-g2")
    out, _, tlog, dlog = _run(impl, sp, tt, dt, prompt, gamma, new)
    blocks, _ = _replay(tt, dt, prompt[0].tolist(), gamma, new)
    B, P, A, L = len(blocks), sum(len(p) for _, p, _ in blocks), sum(n for *_, n in blocks), prompt.shape[1]
    tpos, dpos = sum(len(f) for _, f in tlog), sum(len(f) for _, f in dlog)
    assert A + B == new, "grader defect: accepted + blocks != max_new_tokens in the replay"
    problems = []
    if not B <= len(tlog) <= B + 1:
        problems.append(f"{len(tlog)} target calls for {B} blocks (one target call per block)")
    if not P <= len(dlog) <= P + 1:
        problems.append(f"{len(dlog)} draft calls for {P} proposals (one draft call per proposal)")
    if tpos != L - 1 + P + B:
        problems.append(f"the target processed {tpos} positions, expected L - 1 + proposed + blocks = {L - 1 + P + B} "
                        f"(a token recomputed, or a cache not reused)")
    if dpos > L + P + B:
        problems.append(f"the draft processed {dpos} positions, at most L + proposed + blocks = {L + P + B}")
    assert not problems, "call counts outside the contract's bounds: " + "; ".join(problems) + \
        f" (L={L}, gamma={gamma}, {new} new tokens)"


@pytest.mark.part("B")
@pytest.mark.points(3)
def test_a_draft_identical_to_the_target_accepts_every_block(impl, gen, sp):
    """A draft identical to the target: ``blocks = ceil(max_new_tokens / (gamma + 1))`` target calls
    (+1 for a separate prefill), every proposal accepted."""
    V, L, gamma, new = 10, 3, 3, 14
    tt = sp.Tables(gen, V, L + new + 2)
    prompt = _prompt(gen, V, L)
    out, _, tlog, _ = _run(impl, sp, tt, tt, prompt, gamma, new)
    want = math.ceil(new / (gamma + 1))
    calls = len(tlog) - (len(tlog) > 0 and tlog[0][0] == 0 and len(tlog[0][1]) < L)
    assert calls == want, f"a draft identical to the target must accept every proposal: {calls} verification calls " \
        f"for {new} tokens at gamma={gamma}, expected ceil({new} / {gamma + 1}) = {want}"


@pytest.mark.part("B")
@pytest.mark.points(3)
def test_stats_count_what_the_models_saw(impl, gen, sp):
    """``SpecStats``: ``target_calls``/``draft_calls`` what the logs saw, ``blocks``, ``proposed``,
    ``accepted`` the replay's; ``acceptance_rate`` and ``tokens_per_block`` (Python floats, 0.0 when
    nothing ran)."""
    tt, dt, prompt, gamma, new = _case(sp, gen, "L4-g4-close")
    out, st, tlog, dlog = _run(impl, sp, tt, dt, prompt, gamma, new)
    blocks, _ = _replay(tt, dt, prompt[0].tolist(), gamma, new)
    want = {"target_calls": len(tlog), "draft_calls": len(dlog), "blocks": len(blocks),
            "proposed": sum(len(p) for _, p, _ in blocks), "accepted": sum(n for *_, n in blocks)}
    got = {k: getattr(st, k, None) for k in want}
    assert got == want, f"SpecStats {got}, expected {want} (accepted counts draft tokens only, not the " \
        f"correction/bonus tokens; calls include the prefill)"
    rate, tpb = st.acceptance_rate, st.tokens_per_block
    assert type(rate) is float and type(tpb) is float, "acceptance_rate and tokens_per_block must be Python floats"
    assert abs(rate - want["accepted"] / want["proposed"]) < 1e-12 and \
        abs(tpb - (want["accepted"] + want["blocks"]) / want["blocks"]) < 1e-12, \
        f"acceptance_rate {rate} / tokens_per_block {tpb}, expected accepted / proposed and (accepted + blocks) / blocks"
    empty = impl.SpecStats()
    assert empty.acceptance_rate == 0.0 and empty.tokens_per_block == 0.0, \
        "a SpecStats where nothing ran must report 0.0 (no division by zero)"


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_zero_new_tokens_returns_the_prompt_without_a_call(impl, gen, sp):
    tt, dt, prompt, gamma, _ = _case(sp, gen, "L6-g2")
    out, _, tlog, dlog = _run(impl, sp, tt, dt, prompt, gamma, 0)
    assert torch.equal(out, prompt), f"max_new_tokens = 0 must return the prompt, got {out}"
    assert not tlog and not dlog, f"max_new_tokens = 0 must call no model: {len(tlog)} target, {len(dlog)} draft calls"


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_generate_refuses_bad_arguments_before_any_call(impl, gen, sp):
    V, L = 8, 3
    tt, dt = _pair(sp, gen, V, 12)
    prompt = _prompt(gen, V, L)
    other = sp.Tables(gen, V + 1, 12)
    cases = [
        (ValueError, "gamma", "gamma = 0", (prompt, 0, 4), {}),
        (ValueError, "max_new_tokens", "max_new_tokens = -1", (prompt, 2, -1), {}),
        (ValueError, "input_ids", "a (3,) prompt", (prompt[0], 2, 4), {}),
        (ValueError, "input_ids", "a prompt token outside the vocabulary", (prompt + V, 2, 4), {}),
        (TypeError, "", "an int32 prompt", (prompt.int(), 2, 4), {}),
        (ValueError, "max_seq_len", "L + max_new_tokens above max_seq_len", (prompt, 2, 10), {}),
        (ValueError, "temperature", "temperature -1", (prompt, 2, 4), {"temperature": -1.0}),
        (ValueError, "top_p", "top_p 2", (prompt, 2, 4), {"top_p": 2.0, "temperature": 1.0}),
    ]
    for exc, name, case, args, kw in cases:
        target, draft = sp.models(impl, tt, dt)
        e = expect_raises(exc, f"speculative_generate with {case}", impl.speculative_generate, target, draft, *args, **kw)
        assert name in str(e), f"speculative_generate with {case} raised {e!r}: the message must name {name}"
        assert not model_log(target) and not model_log(draft), f"speculative_generate with {case} called a model before raising"
    target, draft = sp.models(impl, tt, other)
    e = expect_raises(ValueError, "a draft with another vocab_size", impl.speculative_generate, target, draft, prompt,
                      2, 4)
    assert "vocab_size" in str(e), f"a draft with another vocabulary raised {e!r}: the message must name vocab_size"


# --- temperature > 0 ------------------------------------------------------------------------------------

N_RUNS = 1500


@pytest.mark.part("B")
@pytest.mark.points(10)
def test_sampling_is_distributed_as_the_target(impl, gen, sp):
    """Temperature > 0: the 3 new tokens of 1500 runs (generators seeded 0..1499) are distributed as
    sampling the target step by step with ``logits_to_probs`` (V = 4, with top_k and top_p): the same
    processing on both sides, each proposal drawn from the q that verification receives (the expected
    distribution from the submission's own ``logits_to_probs``: its bugs are Part A's). (One run set
    for both filters: 1500 runs cost about 2 s; the filters themselves are graded in Part A.) The tables are
    drawn until a greedy proposal would move the first token's distribution by at least 0.4 (L1): a draft
    whose processed q is one-hot would hide that bug."""
    V, L, gamma, new, T = 4, 2, 2, 3, 1.3
    kw = {"top_k": 3, "top_p": 0.8}
    filt = "top_k 3, top_p 0.8"
    while True:
        tt, dt = _pair(sp, gen, V, L + new + 2, draft_scale=1.5)
        prompt = _prompt(gen, V, L)
        if _top_p_margin(sp, tt, dt, prompt[0].tolist(), new, T, 0.8, 3) >= 1e-3 and \
                _greedy_proposal_gap(sp, tt, dt, prompt[0].tolist(), T, 0.8, 3) >= 0.4:
            break
    joint = sp.joint_probs(impl, tt, prompt[0].tolist(), new, T, kw.get("top_k"), kw.get("top_p"))
    outs, _ = spec_runs(impl.speculative_generate, *sp.models(impl, tt, dt), prompt, gamma, new,
                        dict(kw, temperature=T), list(range(N_RUNS)))
    cells = sorted(set(joint) | {tuple(r) for r in outs.tolist()})
    index = {c: i for i, c in enumerate(cells)}
    counts = torch.zeros(len(cells))
    for r in outs.tolist():
        counts[index[tuple(r)]] += 1
    probs = torch.tensor([joint.get(c, 0.0) for c in cells], dtype=torch.float64)
    sp.l1_check(counts, probs, f"lossless speculative sampling ({filt}, temperature {T}, gamma {gamma}): the "
                               f"{new} new tokens must be distributed as sampling the target step by step (the draft's "
                               f"q processed like p and the proposal drawn from that q)")


def _greedy_proposal_gap(sp, tt, dt, prompt, T, top_p, top_k):
    """L1 distance between the first new token's distribution p and what verification with q makes of the
    draft's ARGMAX (a greedy proposal at temperature > 0): the inputs must tell the two apart (a draft whose
    processed q is one-hot, or a target sure of the draft's favourite, would not)."""
    p, q = (sp.oracle_probs(m.next_logits(prompt), T, top_k, top_p) for m in (tt, dt))
    a = int(q.argmax())
    if p[a] >= q[a]:
        got = torch.zeros_like(p)
        got[a] = 1
    else:
        resid = (p - q).clamp(min=0)
        got = resid / resid.sum() * (1 - p[a] / q[a])
        got[a] = p[a] / q[a]
    return float((got - p).abs().sum())


def _top_p_margin(sp, tt, dt, prompt, new, T, top_p, top_k):
    """The smallest distance between top_p and a prefix sum of any distribution either model can meet
    (after top-k)."""
    margin, frontier = 1.0, [list(prompt)]
    for _ in range(new + 1):
        nxt = []
        for seq in frontier:
            for m in (tt, dt):
                z = m.next_logits(seq) / T
                z = z.masked_fill(z < z.topk(top_k).values[-1], -float("inf"))
                p = torch.softmax(z, -1).sort(descending=True).values.cumsum(0)
                margin = min(margin, float((p - top_p).abs().min()))
            nxt += [seq + [v] for v in range(tt.V)]
        frontier = nxt if len(nxt) < 400 else frontier
    return margin


@pytest.mark.part("B")
@pytest.mark.points(3)
def test_accepted_counts_follow_the_overlap_of_p_and_q(impl, gen, sp):
    """Constant logits (target p, draft q the same at every position; top_k 2): the first block's accepted
    count (read from the target's log and the output) follows ``P(k) = alpha^k (1 - alpha)`` (k < gamma),
    ``alpha^gamma`` (k = gamma), ``alpha = sum_x min(p, q)``: proposals sampled from q, the same
    processing on both sides."""
    V, L, gamma, new, T, top_k = 5, 2, 3, 4, 1.0, 2
    tt, dt = _pair(sp, gen, V, L + new + 2)
    # the same top-2 tokens a, b on both sides: the target sharp (p ~ [0.8, 0.2] on them), the draft flat (q ~
    # [0.55, 0.45] after top-k, its other tokens holding about half of its unfiltered mass): alpha ~ 0.75
    a, b, *rest = torch.randperm(V, generator=gen).tolist()
    jitter = 0.1 * torch.rand(2, V, generator=gen, dtype=torch.float64)
    for m, (la, lb, lo), j in ((tt, (2.0, 0.6, -3.0), jitter[0]), (dt, (0.3, 0.1, -0.3), jitter[1])):
        row = torch.full((V,), lo, dtype=torch.float64) - j
        row[a], row[b] = la + j[a], lb - j[b]
        m.W[:] = row
        m.P.zero_()
        m.S.zero_()
    p, q = sp.processed(impl, torch.stack([tt.W[0], dt.W[0]]), T, top_k, None)   # the submission's processing
    alpha = float(torch.minimum(p, q).sum())
    probs = torch.tensor([alpha ** k * (1 - alpha) for k in range(gamma)] + [alpha ** gamma], dtype=torch.float64)
    prompt = _prompt(gen, V, L)
    outs, logs = spec_runs(impl.speculative_generate, *sp.models(impl, tt, dt), prompt, gamma, new,
                           {"temperature": T, "top_k": top_k}, list(range(N_RUNS)))
    counts = torch.zeros(gamma + 1)
    for out, (tl, _, _) in zip(outs.tolist(), logs):
        props = _first_block_props(tl, L, gamma)
        k = 0
        while k < gamma and props[k] == out[k]:
            k += 1
        counts[k] += 1
    sp.l1_check(counts, probs, f"accepted proposals per block must follow alpha^k (1 - alpha) (alpha = {alpha:.3f}): "
                               f"proposals drawn from the processed q (temperature, top-k) and verified with that q, accepted with "
                               f"probability min(1, p/q)")


def _first_block_props(tlog, L, gamma):
    """The first block's proposals: positions L .. L+gamma-1 of what the target was fed up to the first
    call that reaches past them (a prefill call, if any, feeds only prompt tokens)."""
    fed = []
    for f in tlog:
        fed += f
        if len(fed) >= L + gamma:
            return fed[L:L + gamma]
    return [-1] * gamma
