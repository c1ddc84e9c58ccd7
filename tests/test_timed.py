"""harness.sandbox.timed and the ``timed`` probe: candidate and baseline timed in one
process, next to the implementation, and cross-checked from outside."""
from __future__ import annotations

import textwrap
import time

import pytest
import torch

from harness import bench
from harness.sandbox import worker as sandbox
from harness.sandbox.timing import timed

SDPA = "torch.nn.functional.scaled_dot_product_attention"
FORBID = [SDPA, "torch._C._nn.scaled_dot_product_attention"]

HONEST = textwrap.dedent('''
    import torch
    import torch.nn.functional as F

    def noop(x):
        return x

    def wrong(q, k, v):
        return q

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v

    def slow_attention(q, k, v):
        x = torch.randn(192, 192)
        for _ in range(40):  # ~10 ms of matmuls, then the right answer
            x = (x @ x).tanh()
        return attention(q, k, v)

    def slower_attention(q, k, v):
        x = torch.randn(192, 192)
        for _ in range(180):  # ~22 ms of matmuls on an idle machine (3x one call's share below)
            x = (x @ x).tanh()
        return attention(q, k, v)

    def sneaky(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def sneaky_binding(q, k, v):
        return torch._C._nn.scaled_dot_product_attention(q, k, v)

    def sneaky_swallowed(q, k, v):
        try:
            return F.scaled_dot_product_attention(q, k, v)
        except AssertionError:
            return attention(q, k, v)

    def sneaky_aten(q, k, v):
        return torch.ops.aten.scaled_dot_product_attention(q, k, v)
''')

# The same code, plus an import-time attack on every clock the probe could read.
LIAR = HONEST + textwrap.dedent('''
    import time
    import harness.bench
    import harness.sandbox.probes.common, harness.sandbox.probes.measure, harness.sandbox.probes.timing
    _fake = [0.0]

    def _clock():
        _fake[0] += 1e-9
        return _fake[0]

    for _m in (time, harness.bench, harness.sandbox.probes.common, harness.sandbox.probes.measure,
               harness.sandbox.probes.timing):
        for _name in ("perf_counter", "_perf_counter", "thread_time", "_thread_time", "process_time", "monotonic",
                      "_monotonic"):
            if hasattr(_m, _name):
                setattr(_m, _name, _clock)
''')


def _sandbox(tmp_path, source, name):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    cfg = sandbox.WorkerConfig(module_source=source, module_filename=f"{name}.py", api=[], call_timeout_s=120)
    sb = sandbox.Sandbox(cfg, path)
    sb.ensure()
    sb.begin_test()
    return sb, sandbox.RemoteModule(sb, path, name)


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    sb, impl = _sandbox(tmp_path_factory.mktemp("honest"), HONEST, "honest")
    yield impl
    sb.close()


@pytest.fixture(scope="module")
def liar(tmp_path_factory):
    sb, impl = _sandbox(tmp_path_factory.mktemp("liar"), LIAR, "liar")
    yield impl
    sb.close()


def _pool(n, shape=(1, 2, 16, 16), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(shape, generator=g) for _ in range(3)) for _ in range(n)]


def _checker(pool):
    def check(i, out):
        want = torch.nn.functional.scaled_dot_product_attention(*pool[i])
        assert torch.allclose(out, want, atol=1e-5), f"timed output {i} is wrong"
    return check


def test_noop_overhead_is_small_locally_and_in_the_worker(honest, capsys):
    """A no-op timed against itself: per-call figures stay far below a millisecond, both
    in-process and in the worker (the pipe round trip is outside the timed calls)."""
    import importlib.util
    import sys
    spec = importlib.util.spec_from_loader("honest_local", loader=None)
    local = importlib.util.module_from_spec(spec)
    exec(HONEST, local.__dict__)
    sys.modules["honest_local"] = local
    try:
        x = [(torch.zeros(4),)] * 10
        t_local = timed(local.noop, local.noop, x, warmup_inputs=x[:3])
    finally:
        sys.modules.pop("honest_local", None)
    t_remote = timed(honest.noop, honest.noop, x, warmup_inputs=x[:3])
    calls = 10
    t0 = time.perf_counter()
    for _ in range(calls):
        honest.noop(torch.zeros(4))
    proxied = (time.perf_counter() - t0) / calls
    direct = bench._median([_direct_call_s(local.noop) for _ in range(11)])
    for name, t in (("local", t_local), ("worker", t_remote)):
        assert t.candidate_s < 5e-4 and t.baseline_s < 5e-4, (name, t)
        assert not t.outside, (name, t.figures)
    with capsys.disabled():
        print(f"\nno-op per call: direct {direct * 1e6:.1f} us, timed locally {t_local.candidate_s * 1e6:.1f} us, "
              f"timed in the worker {t_remote.candidate_s * 1e6:.1f} us, a proxied call {proxied * 1e6:.0f} us; "
              f"whole timed request: local {t_local.figures['outside_total_s'] * 1e3:.1f} ms, worker "
              f"{t_remote.figures['outside_total_s'] * 1e3:.1f} ms ({t_remote.figures['outside_clock']})")


def _direct_call_s(fn):
    x = torch.zeros(4)
    t0 = time.thread_time()
    fn(x)
    return time.thread_time() - t0


def test_honest_figures_are_accepted(honest):
    pool = _pool(10)
    t = timed(honest.slow_attention, SDPA, pool, warmup_inputs=_pool(3, seed=1), check=_checker(pool),
              forbid=FORBID)
    assert not t.outside and t.ratio > 10, t.figures  # ~10 ms against a tiny SDPA


def test_a_submission_faking_the_clocks_gains_nothing(honest, liar):
    """The worker's clocks report ~0 s per call; the outside figure (the worker's CPU time
    from /proc, or the wall clock) is graded instead, so the ratio stays that of the
    honest twin (within the noise), never the tiny claimed one."""
    pool, warm = _pool(10), _pool(3, seed=1)
    truth = timed(honest.slow_attention, SDPA, pool, warmup_inputs=warm, check=_checker(pool), forbid=FORBID)
    faked = timed(liar.slow_attention, SDPA, pool, warmup_inputs=warm, check=_checker(pool), forbid=FORBID)
    assert faked.figures["claimed_candidate_s"] < 1e-6, faked.figures  # the lie did reach the probe
    assert faked.outside, faked.figures
    assert faked.ratio > truth.ratio / 3, (truth.figures, faked.figures)


@pytest.mark.parametrize("fn", ["sneaky", "sneaky_binding", "sneaky_swallowed", "sneaky_aten"])
def test_a_candidate_calling_sdpa_during_timed_calls_fails(honest, fn):
    pool = _pool(10)
    with pytest.raises(AssertionError, match="scaled_dot_product"):
        timed(getattr(honest, fn), SDPA, pool, warmup_inputs=_pool(3, seed=1), check=_checker(pool),
              forbid=FORBID, forbid_ops=["scaled_dot_product"], reason="timed against SDPA")


def test_the_baseline_may_call_what_the_candidate_must_not(honest):
    pool = _pool(10)
    t = timed(honest.attention, SDPA, pool, warmup_inputs=_pool(3, seed=1), check=_checker(pool), forbid=FORBID,
              forbid_ops=["scaled_dot_product"])
    assert t.ratio > 0 and t.baseline_s > 0


def test_a_wrong_timed_output_fails_the_check(honest):
    pool = _pool(10)
    with pytest.raises(AssertionError, match="timed output"):
        timed(honest.wrong, SDPA, pool, warmup_inputs=_pool(3, seed=1), check=_checker(pool))


def test_untrusted_baseline_names_are_refused(honest):
    pool = _pool(10)
    with pytest.raises(ValueError, match="not a trusted baseline"):
        timed(honest.attention, "os.system", pool, warmup_inputs=_pool(3, seed=1))


def test_time_interleaved_still_times_local_callables():
    t = bench.time_interleaved({"a": lambda x: x + 1, "b": lambda x: x * 2}, lambda i: (torch.full((8,), float(i)),),
                               lambda name, out, args: None, device="cpu")
    assert set(t) == {"a", "b"} and all(len(tm.times_s) == 10 and len(tm.warmup_s) == 3 for tm in t.values())


def test_a_candidate_too_slow_to_time_fails_without_a_timeout(honest):
    pool = _pool(10)
    with pytest.raises(AssertionError, match="too slow to time"):
        # a 0.3 s limit over 15 calls leaves each 0.3 / 45 s = 6.7 ms: slow_attention (~5 ms idle) can pass it
        timed(honest.slower_attention, SDPA, pool, warmup_inputs=_pool(3, seed=1), timeout=0.3)
    assert honest.noop(3) == 3  # the worker is still the same, healthy one


BANDED = textwrap.dedent('''
    def base(a, b):
        return a @ b

    def slower(a, b):
        """The same product and 9/20 of it again: measured 1.18-1.40 x base over 40 regrades here."""
        out = a @ b
        (a[: a.shape[0] * 9 // 20] @ b).sum()
        return out
''')


@pytest.mark.alone  # CI's other worker, running gradings beside it, moved its ratios by up to 3x
def test_a_ratio_near_a_band_edge_gets_the_same_credit_on_every_regrade(tmp_path):
    """Issue "Graders that charge one deviation once" 14: perf credit in bands, the ratio
    measured until its interval lies inside one (median of interleaved pairs, more rounds
    while it straddles an edge): 10 regrades of one submission near an edge, one credit."""
    from harness.manifest import PerfThreshold
    # Two bands, one edge at 1.5, about 0.2 above the ratio: one submission's ratio moved by up to 7% between
    # regrades on this 2-core box (1.18-1.40), more than a 4-band lab's 0.25-wide bands absorb 0.1 from an edge
    threshold = PerfThreshold(baseline="base", full_credit=1.0, zero_credit=2.0, bands=2)
    sb, impl = _sandbox(tmp_path, BANDED, "banded")
    try:
        g = torch.Generator().manual_seed(0)
        pool = [(torch.randn(384, 384, generator=g), torch.randn(384, 384, generator=g)) for _ in range(10)]
        warm = [(torch.randn(384, 384, generator=g), torch.randn(384, 384, generator=g)) for _ in range(3)]
        impl.slower(*pool[0]), impl.base(*pool[0])  # as a grading's earlier tests would: the worker is warm
        # and one discarded measurement: a worker's first timed pairs run on code pages it has not yet
        # touched since its fork (the CI run saw 1.242 then nine ratios of 1.27-1.38 on a loaded box)
        timed(impl.slower, impl.base, pool, warmup_inputs=warm, edges=threshold.edges())
        credits, ratios = [], []
        for _ in range(10):
            t = timed(impl.slower, impl.base, pool, warmup_inputs=warm, edges=threshold.edges())
            assert t.interval[0] <= t.ratio <= t.interval[1] and t.figures["pairs"] >= 10
            credits.append(threshold.credit(t.ratio))
            ratios.append(round(t.ratio, 3))
        assert len(set(credits)) == 1, f"credits {credits} from ratios {ratios}"
    finally:
        sb.close()


# A submission that slows torch's fully_shard beside it: at import it wraps AdamW.step so that a step over
# DTensor parameters (fully_shard's, never the submission's own shards) burns 0.3 s of CPU first
SLOWS_THE_BASELINE = '''

import time as _time

_adamw_step = torch.optim.AdamW.step


def _slow_step(self, *args, **kwargs):
    if any(type(p).__name__ == "DTensor" for g in self.param_groups for p in g["params"]):
        end = _time.thread_time() + 0.3
        while _time.thread_time() < end:
            pass
    return _adamw_step(self, *args, **kwargs)


torch.optim.AdamW.step = _slow_step
'''


# A lab 14 submission that slows the graders' target-only decoding in its process: at import it wraps
# Tensor.argmax so that a call made by TargetOnly (the baseline; never the submission's own loop) burns 30 ms
SLOWS_TARGET_ONLY = '''

import sys as _sys
import time as _time

_argmax = torch.Tensor.argmax


def _slow_argmax(self, *args, **kwargs):
    caller = _sys._getframe(1).f_locals.get("self")
    if type(caller).__name__ == "TargetOnly":
        end = _time.thread_time() + 0.03
        while _time.thread_time() < end:
            pass
    return _argmax(self, *args, **kwargs)


torch.Tensor.argmax = _slow_argmax
'''


@pytest.mark.parametrize("number, patch, select, name, mine", [
    ("15", SLOWS_THE_BASELINE, "cpu_step_time", "fully_shard", "student"),
    ("14", SLOWS_TARGET_ONLY, "cpu_time_against", "target_only", "speculative")], ids=["15-fully_shard", "14-target_only"])
def test_a_baseline_slowed_by_the_submission_is_graded_against_its_clean_twin(number, patch, select, name, mine,
                                                                               tmp_path):
    """A baseline that must run in the submission's processes (lab 15: torch's fully_shard on its
    ranks; lab 14: target-only decoding of the graders' models) is slowed by the submission: its
    time there is graded within a factor of its time where no submission code ran (twin ranks,
    ``run_ranks(clean=True)``; the grader's own process), by ``against_twin``."""
    from harness import grading
    from harness.sandbox.timing import TWIN_TOLERANCE

    from .conftest import ROOT, course
    c = course()
    lab = c.lab(number)
    sub = tmp_path / number
    sub.mkdir()
    (sub / lab.filename).write_text((ROOT / "solutions" / number / lab.filename).read_text() + patch)
    result = grading.grade(tmp_path, lab, c, seed=5, select=select)
    (test,) = result.tests
    assert test.outcome == "passed", test.output
    (perf,) = test.perf
    f = perf["figures"]
    beside, alone, graded = f[f"{name}_beside_you_ms"], f[f"{name}_alone_ms"], f[f"{name}_ms"]
    assert beside > 3.5 * alone, f"the patch did not slow the baseline beside it, or the twin ran it too: {f}"
    assert f["baseline_clamped"] == 1.0 and graded <= TWIN_TOLERANCE["cpu"] * alone * 1.001, f
    # the ratio graded is over the clamped baseline (the median of the pairs, rescaled), not the slowed one
    assert perf["ratio"] == pytest.approx(f[f"{mine}_ms"] / graded, rel=0.25), (perf["ratio"], f)
