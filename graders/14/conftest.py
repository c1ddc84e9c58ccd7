"""Shared oracles and models of the lab 14 graders, given to tests as the ``sp`` fixture.

Statistics (the contract's rule): N independent trials, empirical frequencies over k cells
against the exact distribution computed in float64, failed when the L1 distance reaches
``sqrt(2 (ln(2^k - 2) + ln(1/delta)) / N)`` (Weissman et al. 2003), ``delta = 1e-6`` per test:
a correct submission fails a statistical test with probability below 1e-6. Every input comes
from the run seed, so a submission always gets the same verdict.

The graders' models (Part B): ``Tables`` holds a model's parameters and computes its logits
here; its twin next to the implementation is the harness's trusted ``TableModel``
(``harness.toolkit.build_spec_models``): its cache stores token ids (``seq_len``, ``crop``), row t
of its logits is ``W[x_t] + P[t] + S[(x_0 + ... + x_t) mod 7]`` in float64 (a function of the whole
prefix, so a stale cache changes what it returns), it refuses a cache past the length
``make_cache`` asked for, and it records every call, ``(seq_len before, the tokens fed)``, in the
harness's probe module, never on the objects the submission gets (``model_log``, ``spec_runs``;
a log changed by anything but the model fails the read). No grader code runs in the sandbox. A
log is still a claim from the submission's process: the graders replay it against the output
(every call must feed the emitted sequence plus the block's proposals), so a log that disagrees
with the output fails.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.toolkit import build_spec_models, one_thread

DELTA = 1e-6
K_MIX = 7

def l1_bound(k: int, n: int, delta: float = DELTA) -> float:
    """Weissman et al. (2003): P(||p_hat - p||_1 >= eps) <= (2^k - 2) exp(-n eps^2 / 2)."""
    return math.sqrt(2 * (math.log(2 ** k - 2) + math.log(1 / delta)) / n)


def l1_check(counts: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    """Empirical frequencies of ``counts`` against ``probs`` (float64); the cells with probability 0 must
    hold no count (exact)."""
    counts, probs = counts.to(torch.float64).flatten(), probs.to(torch.float64).flatten()
    n = float(counts.sum())
    bad = ((probs == 0) & (counts > 0)).nonzero().flatten().tolist()
    if bad:
        raise AssertionError(f"{what}: cells of probability 0 were drawn: cell(s) {bad[:5]} "
                             f"(counts {counts[bad[:5]].long().tolist()})")
    if n == 0:
        return
    k = int((probs > 0).sum()) if probs.numel() > 1 else 2
    dist = float((counts / n - probs).abs().sum())
    bound = l1_bound(max(k, 2), int(n))
    if dist >= bound:
        freq = [round(x, 4) for x in (counts / n).tolist()[:12]]
        want = [round(x, 4) for x in probs.tolist()[:12]]
        raise AssertionError(f"{what}: the empirical distribution of {int(n)} draws is {dist:.4f} (L1) from the "
                             f"exact one, the bound at delta=1e-6 is {bound:.4f}; frequencies {freq}, expected {want}")


def oracle_probs(logits, temperature=1.0, top_k=None, top_p=None) -> torch.Tensor:
    """The contract's sampling distribution in float64, row by row in Python order (written apart
    from the reference's vectorised one)."""
    z = logits.to(torch.float64).reshape(-1, logits.shape[-1])
    out = torch.zeros_like(z)
    for r, row in enumerate(z):
        vals = row.tolist()
        V = len(vals)
        if temperature == 0:
            out[r, max(range(V), key=lambda i: (vals[i], -i))] = 1
            continue
        zs = [v / temperature for v in vals]
        keep = [v > -math.inf for v in zs]
        if top_k is not None and top_k < V:
            kth = sorted(zs, reverse=True)[top_k - 1]
            keep = [k and v >= kth for k, v in zip(keep, zs)]
        if top_p is not None and top_p < 1:
            m = max(v for v, k in zip(zs, keep) if k)
            w = [math.exp(v - m) if k else 0.0 for v, k in zip(zs, keep)]
            s = sum(w)
            order = sorted(range(V), key=lambda i: (-w[i] / s, i))
            before, kept = 0.0, set()
            for i in order:
                if before < top_p:
                    kept.add(i)
                before += w[i] / s
            keep = [k and i in kept for i, k in enumerate(keep)]
        m = max(v for v, k in zip(zs, keep) if k)
        w = torch.tensor([math.exp(v - m) if k else 0.0 for v, k in zip(zs, keep)], dtype=torch.float64)
        out[r] = w / w.sum()
    return out.reshape(logits.shape)


class Tables:
    """A table model's parameters, its float64 logits (the graders' side) and the spec of its twin (``models``)."""

    def __init__(self, gen, V, max_len, scale=1.0, name="target"):
        self.name, self.V, self.max_len = name, V, max_len
        self.W = torch.randn(V, V, generator=gen, dtype=torch.float64) * scale
        self.P = torch.randn(max_len, V, generator=gen, dtype=torch.float64) * scale * 0.5
        self.S = torch.randn(K_MIX, V, generator=gen, dtype=torch.float64) * scale * 0.5

    def logits(self, seq: list[int]) -> torch.Tensor:
        """Row t: the logits after ``seq[:t+1]``."""
        rows, total = [], 0
        for t, x in enumerate(seq):
            total += x
            rows.append(self.W[x] + self.P[t] + self.S[total % K_MIX])
        return torch.stack(rows)

    def next_logits(self, seq):
        return self.logits(seq)[-1]

    def greedy(self, prompt: list[int], new: int) -> list[int]:
        seq = list(prompt)
        for _ in range(new):
            seq.append(int(oracle_probs(self.next_logits(seq), 0).argmax()))
        return seq[len(prompt):]

    def spec(self, dtype=torch.float64, max_seq_len=None) -> dict:
        return {"name": self.name, "W": self.W, "P": self.P, "S": self.S, "max_seq_len": max_seq_len or self.max_len,
                "dtype": dtype}


def models(impl, *tables) -> list:
    """The trusted table models of ``tables`` (``Tables``), built next to the implementation
    (``harness.toolkit.build_spec_models``; their logs read with ``model_log``)."""
    return build_spec_models(impl, [t.spec() for t in tables])


def processed(impl, logits: torch.Tensor, temperature, top_k, top_p) -> torch.Tensor:
    """The distributions ``logits (n, V)`` give under the SUBMISSION's own ``logits_to_probs`` (the contract's
    "sampling the target step by step with logits_to_probs"), so that a Part A bug in it costs no Part B point;
    the graders' oracle where it raises or returns no distribution (a stub, a malformed answer)."""
    want = oracle_probs(logits, temperature, top_k, top_p)
    try:
        got = impl.logits_to_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    except Exception:  # noqa: BLE001 - graded in Part A; here the oracle stands in
        return want
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or not bool(torch.isfinite(got).all()) \
            or bool((got < 0).any()) or bool(((got.double().sum(-1) - 1).abs() > 1e-6).any()):
        return want
    return got.double()


def joint_probs(impl, tables, prompt, new, temperature, top_k, top_p) -> dict:
    """Exact probability of every continuation of ``new`` tokens, sampling the target step by step with
    ``logits_to_probs`` (:func:`processed`: every context's logits in one call)."""
    contexts = [()]
    for _ in range(new - 1):
        contexts += [c + (v,) for c in contexts if len(c) == len(contexts[-1]) for v in range(tables.V)]
    logits = torch.stack([tables.next_logits(list(prompt) + list(c)) for c in contexts])
    dist = dict(zip(contexts, processed(impl, logits, temperature, top_k, top_p)))
    out = {(): 1.0}
    for _ in range(new):
        nxt = {}
        for seq, pr in out.items():
            p = dist[seq]
            for v in range(tables.V):
                if p[v] > 0:
                    nxt[seq + (v,)] = pr * float(p[v])
        out = nxt
    return out


@pytest.fixture(autouse=True)
def _one_thread(impl):
    """torch's intra-op threads at 1 on both sides (``harness.toolkit.one_thread``)."""
    with one_thread(impl):
        yield


@pytest.fixture
def sp():
    return SimpleNamespace(l1_bound=l1_bound, l1_check=l1_check, oracle_probs=oracle_probs, Tables=Tables,
                           models=models, joint_probs=joint_probs,
                           processed=processed)
