"""Hidden graders of lab 17, part B: the alpha-beta model of the three all-reduce algorithms.

``allreduce_time`` against the contract's closed forms (relative 1e-9), one algorithm per test and
the halving-doubling placement rules (which round pays the inter-node link, the fold) apart;
``choose_allreduce`` in regimes where each algorithm wins and on ties; the refusals. Inputs come
from the test's seed: world sizes and local sizes the handout and the visible tests do not show.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.toolkit import expect_raises

ALGS = ("ring", "halving_doubling", "hierarchical")
SHOWN = {(8, 4), (6, 3), (12, 4)}   # (P, L) of the handout and the visible tests: never reused


def _ri(gen, lo, hi):
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def _u(gen, lo, hi):
    return float(torch.empty((), dtype=torch.float64).uniform_(lo, hi, generator=gen))


def model(alg, n, P, L, ai, bi, ae, be):
    """The contract's closed forms, written out."""
    if P == 1:
        return 0.0
    m = P // L
    if alg == "ring":
        a, b = (ai, bi) if m == 1 else (ae, be)
        return 2 * (P - 1) * (a + n / P * b)
    if alg == "hierarchical":
        return 2 * (L - 1) * (ai + n / L * bi) + 2 * (m - 1) * (ae + n / P * be)
    q = 2 ** int(math.floor(math.log2(P)))
    r = P - q
    t = 0.0
    for j in range(int(round(math.log2(q)))):
        intra = m == 1 or (r == 0 and L % 2 ** (j + 1) == 0)
        a, b = (ai, bi) if intra else (ae, be)
        t += 2 * (a + n / 2 ** (j + 1) * b)
    if r:
        a, b = (ai, bi) if (m == 1 or L % 2 == 0) else (ae, be)
        t += 2 * (a + n * b)
    return t


def links(gen):
    return dict(alpha_intra=_u(gen, 1e-6, 5e-6), beta_intra=_u(gen, 1e-11, 5e-11),
                alpha_inter=_u(gen, 5e-6, 4e-5), beta_inter=_u(gen, 1e-10, 8e-10))


def close(got, want):
    return isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-300)


def check_time(impl, alg, n, P, L, lk, what):
    got = impl.allreduce_time(alg, n, P, L, lk["alpha_intra"], lk["beta_intra"], lk["alpha_inter"],
                              lk["beta_inter"])
    want = model(alg, n, P, L, *lk.values())
    if not close(got, want):
        raise AssertionError(f"{what} (allreduce_time({alg!r}, n_bytes={n}, P={P}, L={L}, {lk})): got {got!r}, "
                             f"the closed form gives {want!r}")


MUST = [(5, 5), (10, 2), (18, 6), (16, 16), (32, 8), (20, 1)]   # one node; folds intra and inter; aligned rounds


def cases(gen, pick):
    """Random (P, L) with ``pick``, after the MUST cases it admits (each placement rule is exercised)."""
    out = [(_ri(gen, 1, 1 << 28), P, L, links(gen)) for P, L in MUST if pick(P, L)]
    while len(out) < 12:
        P = _ri(gen, 2, 32)
        divs = [L for L in range(1, P + 1) if P % L == 0]
        L = divs[_ri(gen, 0, len(divs) - 1)]
        if (P, L) not in SHOWN and pick(P, L):
            out.append((_ri(gen, 1, 1 << 28), P, L, links(gen)))
    return out


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_ring_time_matches_the_closed_form(impl, gen):
    for n, P, L, lk in cases(gen, lambda P, L: True):
        check_time(impl, "ring", n, P, L, lk, "ring time: 2 (P-1) (alpha + n/P beta), on the inter-node link once "
                   "there is more than one node")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_hierarchical_time_matches_the_closed_form(impl, gen):
    for n, P, L, lk in cases(gen, lambda P, L: True):
        check_time(impl, "hierarchical", n, P, L, lk, "hierarchical time: 2 (L-1) (alpha_intra + n/L beta_intra) + "
                   "2 (m-1) (alpha_inter + n/P beta_inter)")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_halving_doubling_time_power_of_two(impl, gen):
    """P a power of two: round j (half the vector at j = 0) is intra-node iff aligned blocks of 2^(j+1) fit."""
    for n, P, L, lk in cases(gen, lambda P, L: P & (P - 1) == 0):
        check_time(impl, "halving_doubling", n, P, L, lk, "halving-doubling round placement or volume wrong: round "
                   "j sends n/2^(j+1) bytes twice, intra-node iff L % 2^(j+1) == 0")


@pytest.mark.part("B")
@pytest.mark.points(1)
def test_halving_doubling_time_with_the_fold(impl, gen):
    """P not a power of two: every round on the inter link once m > 1, plus the fold 2 (alpha + n beta)."""
    for n, P, L, lk in cases(gen, lambda P, L: P & (P - 1) != 0):
        check_time(impl, "halving_doubling", n, P, L, lk, "halving-doubling with the fold wrong: r = P - q > 0 adds "
                   "2 (alpha_f + n beta_f), intra iff m == 1 or L even; every round pays the inter link once m > 1")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_choose_allreduce_regimes_and_ties(impl, gen):
    lk = links(gen)
    regimes = [  # (n, P, L): which algorithm the model prefers is computed, not assumed
        (_ri(gen, 1, 64), 16, 4), (_ri(gen, 1 << 26, 1 << 28), 24, 6), (_ri(gen, 1 << 26, 1 << 28), 20, 5),
        (_ri(gen, 1 << 10, 1 << 20), 10, 1), (_ri(gen, 1, 1 << 20), 1, 1), (_ri(gen, 1 << 20, 1 << 24), 7, 7)]
    seen = set()
    for n, P, L in regimes:
        times = [model(a, n, P, L, *lk.values()) for a in ALGS]
        best = min(times)
        want = next(a for a, t in zip(ALGS, times) if t <= best + 1e-9 * abs(best))
        seen.add(want)
        got = impl.choose_allreduce(n, P, L, *lk.values())
        if got != want:
            raise AssertionError(f"choose_allreduce picked {got!r}, the model's fastest is {want!r} (n_bytes={n}, "
                                 f"P={P}, L={L}; times {dict(zip(ALGS, times))}; ties within 1e-9 go to the earlier "
                                 f"name in ALGORITHMS)")
    assert seen == set(ALGS), f"grader defect: regimes cover {seen}"


@pytest.mark.part("B")
@pytest.mark.points(1)
def test_cost_model_errors(impl, gen):
    lk = list(links(gen).values())
    bad = [(ValueError, ("tree", 10, 4, 2, *lk), "unknown algorithm"), (TypeError, ("ring", 10, 4.0, 2, *lk), "P float"),
           (TypeError, ("ring", 10, 4, "2", *lk), "L str"), (ValueError, ("ring", 10, 0, 1, *lk), "P=0"),
           (ValueError, ("ring", 10, 6, 4, *lk), "L does not divide P"),
           (ValueError, ("ring", -1, 4, 2, *lk), "negative n_bytes"),
           (ValueError, ("ring", 10, 4, 2, float("nan"), *lk[1:]), "NaN alpha"),
           (ValueError, ("ring", 10, 4, 2, *lk[:3], float("inf")), "infinite beta")]
    for exc, args, why in bad:
        expect_raises(exc, f"wrong cost-model argument error: allreduce_time{args} ({why})", impl.allreduce_time, *args)
    expect_raises(ValueError, "wrong cost-model argument error: choose_allreduce with L=3 not dividing P=4",
                  impl.choose_allreduce, 10, 4, 3, *lk)
