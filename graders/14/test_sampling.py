"""Hidden graders for lab 14, Part A: ``logits_to_probs`` and ``speculative_sample``.

``logits_to_probs`` is checked against the graders' row-by-row float64 oracle, one rule per
test (temperature 0, top-k ties, top-p order, stability). ``speculative_sample`` is graded
exactly where the contract fixes the result whatever the random numbers (draft = target,
p(x) = 0, one-hot rows), and statistically elsewhere (conftest: L1 bound, delta = 1e-6):
each statistical test feeds every row the same distributions, so the rows are N independent
trials of one step.
"""
from __future__ import annotations

import pytest
import torch

from harness.toolkit import assert_close, expect_raises


def _dist(gen, shape, V, zero=0):
    """Random distributions ``shape + (V,)`` (float64) with ``zero`` tokens of probability 0 per row."""
    w = torch.rand(*shape, V, generator=gen, dtype=torch.float64) + 0.05
    if zero:
        idx = torch.rand(*shape, V, generator=gen).argsort(-1)[..., :zero]
        w.scatter_(-1, idx, 0.0)
    return w / w.sum(-1, keepdim=True)


# --- logits_to_probs ------------------------------------------------------------------------------

@pytest.mark.part("A")
@pytest.mark.points(3)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_temperature_scales_the_softmax(impl, gen, sp, dtype):
    """No filter: ``softmax(logits / T)`` per row, of any rank and layout; float64 in, float64 out;
    float32 otherwise (tolerance 1e-6 / 1e-12 vs float64)."""
    for shape, T in (((7,), 1.0), ((3, 11), 0.7), ((2, 3, 9), 2.5)):
        x = (torch.randn(*shape, generator=gen, dtype=torch.float64) * 3).to(dtype)
        got = impl.logits_to_probs(x, temperature=T)
        tol = 1e-12 if dtype == torch.float64 else 1e-6
        assert getattr(got, "dtype", None) == dtype, f"logits_to_probs of {dtype} logits returned " \
            f"{getattr(got, 'dtype', type(got).__name__)}, expected {dtype}"
        assert_close(got, sp.oracle_probs(x, T), atol=tol, rtol=0, what="softmax(logits / temperature)",
                     case=f"shape {shape}, temperature {T}, {dtype}")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_temperature_zero_is_one_hot_at_the_first_maximum(impl, gen, sp):
    """``temperature == 0``: one-hot at the first maximal logit (ties to the lower index), whatever
    top_k and top_p."""
    x = torch.randint(0, 4, (6, 9), generator=gen).to(torch.float32)   # many exact ties
    for kw in ({}, {"top_k": 2}, {"top_p": 0.3}):
        got = impl.logits_to_probs(x, temperature=0, **kw)
        want = sp.oracle_probs(x, 0)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.equal(got.double(), want):
            raise AssertionError(f"temperature 0 must be one-hot at the FIRST maximal logit (torch.argmax: ties to "
                                 f"the lower index) ({kw or 'no filter'}): row 0 {x[0].tolist()} gave "
                                 f"{got[0].tolist()}, expected {want[0].tolist()}")
        assert_close(got, want, atol=0, rtol=0, what="one-hot at temperature 0", case=str(kw))


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_top_k_keeps_ties_at_the_boundary(impl, gen, sp):
    """top_k keeps every token whose logit is >= the k-th largest: ties at the boundary all kept;
    ``k >= V`` keeps all."""
    x = torch.randint(-3, 3, (8, 10), generator=gen).to(torch.float64) * 0.75
    for k in (1, 3, 5, 12):
        got = impl.logits_to_probs(x, temperature=1.3, top_k=k)
        want = sp.oracle_probs(x, 1.3, top_k=k)
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            kept, wkept = (got > 0).sum(-1), (want > 0).sum(-1)
            if not torch.equal(kept, wkept):
                r = int((kept != wkept).nonzero()[0])
                raise AssertionError(f"top_k must keep every token tied with the k-th largest logit (ties at the "
                                     f"boundary kept): top_k={k}, row {x[r].tolist()} kept {int(kept[r])} tokens, "
                                     f"expected {int(wkept[r])}")
        assert_close(got, want, atol=1e-12, rtol=0, what="top-k distribution", case=f"top_k={k}")


def _top_p_logits(gen, rows, V, top_p):
    """Logit rows whose top-p prefix sums all stay >= 1e-3 from top_p (the contract's promise)."""
    out = []
    while len(out) < rows:
        x = torch.randn(V, generator=gen, dtype=torch.float64) * 1.5
        if rows - len(out) <= 2:
            x[:2] = x.max()          # an exact tie at the top: the stable order keeps the lower index first
        p = torch.softmax(x, -1).sort(descending=True).values.cumsum(0)
        if bool(((p - top_p).abs() >= 1e-3).all()):
            out.append(x)
    return torch.stack(out)


@pytest.mark.part("A")
@pytest.mark.points(4)
def test_top_p_keeps_the_token_that_crosses_top_p(impl, gen, sp):
    """top_p on the distribution left by top-k: tokens in descending probability (ties to the lower
    index), kept while the mass BEFORE them is < top_p (the crossing token is kept); renormalised."""
    for top_p, top_k in ((0.5, None), (0.8, None), (0.3, 4), (0.9, 6)):
        x = _top_p_logits(gen, 6, 9, top_p)
        got = impl.logits_to_probs(x, temperature=1.0, top_k=top_k, top_p=top_p)
        want = sp.oracle_probs(x, 1.0, top_k, top_p)
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            kept, wkept = (got > 0).sum(-1), (want > 0).sum(-1)
            if not torch.equal(kept, wkept):
                r = int((kept != wkept).nonzero()[0])
                raise AssertionError(f"top_p keeps a token iff the probability mass before it (descending order, "
                                     f"ties to the lower index) is < top_p, so the token that crosses top_p is kept: "
                                     f"top_p={top_p}, top_k={top_k}, row {r} kept {int(kept[r])} tokens, expected "
                                     f"{int(wkept[r])} (probabilities {[round(v, 4) for v in want[r].tolist()]})")
        assert_close(got, want, atol=1e-12, rtol=0, what="top-p distribution", case=f"top_p={top_p}, top_k={top_k}")
    x = torch.full((2, 6), -40.0, dtype=torch.float64)
    x[:, 0] = 0.0                                  # the others' mass rounds the running sum to 1
    assert_close(impl.logits_to_probs(x, temperature=1.0, top_p=1.0), sp.oracle_probs(x, 1.0), atol=1e-12, rtol=0,
                 what="top_p = 1.0 filters nothing", case="five tokens of probability ~4e-18")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_probs_are_stable_for_large_logits_and_forbidden_tokens(impl, gen, sp):
    """``logits + 1e4`` gives the same distribution; ``-inf`` marks a forbidden token (probability 0)."""
    x = torch.randn(4, 7, generator=gen, dtype=torch.float64) * 2
    x[:, 2] = -float("inf")
    for off in (1e4, -1e4):
        xs = (x + off).float()
        got = impl.logits_to_probs(xs, temperature=0.9, top_k=5)
        assert_close(got, sp.oracle_probs(xs.double() - off, 0.9, 5), atol=1e-6, rtol=0,
                     what="softmax with the row maximum subtracted (stable)", case=f"logits {off:+g}, float32")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_probs_refuse_bad_arguments(impl, gen):
    x = torch.randn(3, 5, generator=gen)
    for kw, name in (({"temperature": -0.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
                     ({"top_k": 0}, "top_k"), ({"top_k": 2.5}, "top_k"), ({"top_p": 0.0}, "top_p"),
                     ({"top_p": 1.5}, "top_p")):
        e = expect_raises(ValueError, f"logits_to_probs(x, {kw})", impl.logits_to_probs, x, **kw)
        assert name in str(e), f"logits_to_probs(x, {kw}) raised {e!r}: the message must name {name}"
    bad = x.clone()
    bad[1, 2] = float("nan")
    expect_raises(ValueError, "logits_to_probs of logits holding NaN", impl.logits_to_probs, bad)
    bad[1, 2] = float("inf")
    expect_raises(ValueError, "logits_to_probs of logits holding +inf", impl.logits_to_probs, bad)
    expect_raises(TypeError, "logits_to_probs of int64 logits", impl.logits_to_probs, torch.ones(2, 3, dtype=torch.int64))
    expect_raises(ValueError, "logits_to_probs of 0-dim logits", impl.logits_to_probs, torch.tensor(1.0))
    expect_raises(ValueError, "logits_to_probs with V = 0", impl.logits_to_probs, torch.zeros(2, 0))


# --- speculative_sample: exact cases ----------------------------------------------------------------

def _call_sample(impl, q, p, x, seed):
    g = impl.torch.Generator().manual_seed(seed)     # made next to the implementation (a generator has no wire form)
    out = impl.speculative_sample(q, p, x, generator=g)
    tokens, n = out
    return tokens, n


def _draw(gen, q):
    """Draft tokens drawn from q (B, gamma, V) by the graders."""
    B, G, V = q.shape
    return torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(B, G)


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_draft_equal_to_target_accepts_everything(impl, gen, seed):
    """``draft_probs == target_probs[:, :gamma]``: every proposal accepted (``num_accepted = gamma``),
    ``tokens[:, :gamma]`` the proposals, the bonus a token of ``p_gamma``'s support; shapes and dtypes."""
    B, G, V = 300, 4, 6
    p = _dist(gen, (B, G + 1), V, zero=2)
    q = p[:, :G].clone()
    x = _draw(gen, q)
    tokens, n = _call_sample(impl, q, p, x, seed)
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int64 and tokens.shape == (B, G + 1), \
        f"tokens must be ({B}, gamma+1={G + 1}) int64, got {getattr(tokens, 'shape', tokens)} " \
        f"{getattr(tokens, 'dtype', '')}"
    assert isinstance(n, torch.Tensor) and n.dtype == torch.int64 and n.shape == (B,), \
        f"num_accepted must be ({B},) int64, got {getattr(n, 'shape', n)} {getattr(n, 'dtype', '')}"
    if not bool((n == G).all()):
        r = int((n != G).nonzero()[0])
        raise AssertionError(f"a draft equal to the target must accept every proposal (u * q < p with q = p > 0): "
                             f"row {r} accepted {int(n[r])} of {G}")
    assert torch.equal(tokens[:, :G], x), "tokens[:, :gamma] must be the accepted proposals"
    bonus = tokens[:, G]
    assert bool((p[torch.arange(B), G, bonus.clamp(0, V - 1)] > 0).all()) and bool((bonus >= 0).all()), \
        "the bonus token must come from the target's last row p_gamma (a token of probability 0 there was emitted)"


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_a_proposal_the_target_forbids_is_rejected(impl, gen, seed):
    """``p_i(x_i) = 0`` rejects at i (exactly): ``num_accepted`` stops there, then ``-1`` after the
    correction."""
    B, G, V = 200, 3, 5
    p = _dist(gen, (B, G + 1), V)
    q = p[:, :G].clone()
    x = _draw(gen, q)
    stop = torch.randint(0, G, (B,), generator=gen)
    p[torch.arange(B), stop, x[torch.arange(B), stop]] = 0.0
    p = p / p.sum(-1, keepdim=True)
    tokens, n = _call_sample(impl, q, p, x, seed)
    if not torch.equal(n, stop):
        r = int((n != stop).nonzero()[0])
        raise AssertionError(f"a proposal of target probability 0 must be rejected (accept iff u * q(x) < p(x), "
                             f"strict): row {r} accepted {int(n[r])}, its proposal {int(stop[r])} has p = 0")
    pos = torch.arange(G + 1)
    assert bool((tokens[pos[None] > stop[:, None]] == -1).all()), \
        "tokens after the correction must be -1 (vLLM's placeholder)"


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_one_hot_rows_give_the_targets_greedy_chain(impl, gen, seed):
    """Temperature-0 (one-hot) rows: accept while ``x_i == argmax p_i``, then ``argmax p_n`` (the
    correction), or the bonus ``argmax p_gamma`` after a full acceptance; ``-1`` after."""
    B, G, V = 64, 3, 5
    tp = torch.randint(0, V, (B, G + 1), generator=gen)
    x = torch.where(torch.rand(B, G, generator=gen) < 0.7, tp[:, :G], torch.randint(0, V, (B, G), generator=gen))
    p = torch.nn.functional.one_hot(tp, V).to(torch.float32)
    q = torch.nn.functional.one_hot(x, V).to(torch.float32)
    tokens, n = _call_sample(impl, q, p, x, seed)
    want_n = (x == tp[:, :G]).long().cumprod(-1).sum(-1)
    want = torch.full((B, G + 1), -1)
    for b in range(B):
        k = int(want_n[b])
        want[b, :k] = x[b, :k]
        want[b, k] = tp[b, k]
    if not torch.equal(n, want_n):
        r = int((n != want_n).nonzero()[0])
        raise AssertionError(f"num_accepted is the length of the accepted PREFIX (a later match after a rejection does "
                             f"not count): row {r} proposals {x[r].tolist()}, target argmaxes {tp[r].tolist()}: "
                             f"got {int(n[r])}, expected {int(want_n[r])}")
    if not torch.equal(tokens, want):
        r = int((tokens != want).any(-1).nonzero()[0])
        raise AssertionError(f"one-hot rows must give the target's greedy chain: row {r} proposals {x[r].tolist()}, "
                             f"target argmaxes {tp[r].tolist()}: got {tokens[r].tolist()}, expected {want[r].tolist()} "
                             f"(the correction after a rejection at n is argmax p_n; the bonus is argmax p_gamma)")


# --- speculative_sample: distributions ---------------------------------------------------------------

def _sampled(impl, gen, seed, B, G, V, zero=0, dtype=torch.float64):
    p = _dist(gen, (1, G + 1), V, zero=zero)
    q = _dist(gen, (1, G), V)
    P, Q = p.expand(B, -1, -1).to(dtype), q.expand(B, -1, -1).to(dtype)
    x = _draw(gen, Q.double())
    tokens, n = _call_sample(impl, Q, P, x, seed)
    return p[0], q[0], x, tokens, n


@pytest.mark.part("A")
@pytest.mark.points(4)
def test_emitted_tokens_are_distributed_as_the_target(impl, gen, seed, sp):
    """Lossless: among the rows with ``num_accepted >= i``, the token at position i ~ ``p_i``
    (i = 0..gamma), for one-hot-free p with forbidden tokens; 20000 rows (L1 bound, delta 1e-6)."""
    B, G, V = 20000, 2, 5
    p, q, x, tokens, n = _sampled(impl, gen, seed, B, G, V, zero=1)
    for i in range(G + 1):
        rows = n >= i
        counts = torch.bincount(tokens[rows, i].clamp(0, V - 1), minlength=V)
        if bool((tokens[rows, i] < 0).any()):
            raise AssertionError(f"position {i}: rows with num_accepted >= {i} hold -1 there")
        sp.l1_check(counts, p[i], f"lossless sampling: the token at position {i} (rows with num_accepted >= {i}) "
                                  f"must be distributed as the target's p_{i}")


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_the_correction_comes_from_the_residual(impl, gen, seed, sp):
    """After a rejection at n < gamma, the emitted token ~ ``norm(max(0, p_n - q_n))`` of the same position
    (never the rejected token)."""
    B, G, V = 20000, 2, 5
    p, q, x, tokens, n = _sampled(impl, gen, seed, B, G, V)
    for i in range(G):
        rows = n == i
        res = (p[i] - q[i]).clamp_min(0)
        counts = torch.bincount(tokens[rows, i].clamp(0, V - 1), minlength=V)
        sp.l1_check(counts, res / res.sum(), f"the correction after a rejection at position {i} must be drawn from "
                                             f"the residual norm(max(0, p_{i} - q_{i}))")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_the_bonus_comes_from_the_targets_last_row(impl, gen, seed, sp):
    """After gamma acceptances the bonus token ~ ``p_gamma`` (the target's last row, never a draft row)."""
    B, G, V = 20000, 2, 4
    p = _dist(gen, (1, G + 1), V)
    q = p[:, :G].clone()                     # every row accepts: all rows hold a bonus
    P, Q = p.expand(B, -1, -1).contiguous(), q.expand(B, -1, -1).contiguous()
    x = _draw(gen, Q)
    tokens, n = _call_sample(impl, Q, P, x, seed)
    counts = torch.bincount(tokens[:, G].clamp(0, V - 1), minlength=V)
    sp.l1_check(counts, p[0, G], "the bonus token after a full acceptance must be drawn from p_gamma, the target's "
                                 "last row")


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_num_accepted_follows_the_acceptance_probabilities(impl, gen, seed, sp):
    """``P(n >= k) = prod_{i<k} alpha_i``, ``alpha_i = sum_x min(p_i, q_i)``: the acceptance test is
    ``u * q(x) < p(x)`` and counts the accepted prefix; float32 inputs."""
    B, G, V = 20000, 3, 4
    p, q, x, tokens, n = _sampled(impl, gen, seed, B, G, V, dtype=torch.float32)
    alpha = torch.minimum(p[:G], q).sum(-1)
    ge = torch.cat([torch.ones(1, dtype=torch.float64), alpha.cumprod(0)])
    probs = ge - torch.cat([ge[1:], torch.zeros(1, dtype=torch.float64)])
    counts = torch.bincount(n.clamp(0, G), minlength=G + 1)
    sp.l1_check(counts, probs, f"num_accepted must follow the acceptance probabilities min(1, p/q) of the accepted "
                               f"prefix (alpha = {[round(a, 3) for a in alpha.tolist()]})")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_sample_is_reproducible_and_leaves_its_inputs(impl, gen, seed):
    """The same generator state gives the same outputs; the global RNG is left alone; the inputs are not
    modified; strided inputs accepted; ``gamma = 0`` samples ``p_0``."""
    B, G, V = 50, 3, 6
    p = _dist(gen, (B, G + 1), V)
    q = _dist(gen, (B, G), V)
    x = _draw(gen, q)
    wide = torch.zeros(B, G, 2 * V, dtype=torch.float64)
    wide[..., ::2] = q
    qv = wide[..., ::2]
    keep = (p.clone(), q.clone(), x.clone())
    impl.torch.manual_seed(seed)
    before = impl.torch.get_rng_state()
    a = _call_sample(impl, qv, p, x, seed)
    b = _call_sample(impl, q, p, x, seed)
    assert torch.equal(impl.torch.get_rng_state(), before), \
        "speculative_sample with a generator must leave the global RNG state unchanged"
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), \
        "the same inputs and generator seed must give the same tokens (a strided draft_probs view included)"
    assert torch.equal(p, keep[0]) and torch.equal(q, keep[1]) and torch.equal(x, keep[2]), \
        "speculative_sample modified its inputs"
    t0, n0 = _call_sample(impl, q[:, :0], p[:, :1], x[:, :0], seed)
    assert t0.shape == (B, 1) and bool((n0 == 0).all()) and bool((p[torch.arange(B), 0, t0[:, 0]] > 0).all()), \
        "gamma = 0 must sample p_0: tokens (B, 1), num_accepted 0"


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_sample_refuses_bad_arguments(impl, gen):
    B, G, V = 3, 2, 4
    p, q = _dist(gen, (B, G + 1), V), _dist(gen, (B, G), V)
    x = _draw(gen, q)
    cases = [
        (ValueError, "draft_probs", "draft_probs of rank 2", (q[0], p, x)),
        (ValueError, "target_probs", "target_probs with gamma rows instead of gamma+1", (q, p[:, :G], x)),
        (ValueError, "draft_tokens", "draft_tokens of another batch size", (q, p, x[:2])),
        (TypeError, "draft_tokens", "int32 draft_tokens", (q, p, x.int())),
        (TypeError, "", "float64 draft_probs with float32 target_probs", (q, p.float(), x)),
        (ValueError, "draft_tokens", "a draft token outside [0, V)", (q, p, x.clone().fill_(V))),
        (ValueError, "target_probs", "target_probs rows summing to 1.1", (q, p * 1.1, x)),
        (ValueError, "draft_probs", "a negative draft probability", (q - 0.5, p, x)),
    ]
    zq = q.clone()
    zq[0, 0, x[0, 0]] = 0.0
    zq[0, 0] /= zq[0, 0].sum()
    cases.append((ValueError, "draft_tokens", "a proposal of draft probability 0", (zq, p, x)))
    for exc, name, case, args in cases:
        e = expect_raises(exc, f"speculative_sample with {case}", impl.speculative_sample, *args)
        assert name in str(e), f"speculative_sample with {case} raised {e!r}: the message must name {name}"
