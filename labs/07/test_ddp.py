"""Visible tests of lab 07 (a subset of what the hidden graders check).

Each test trains a small model on W gloo ranks through run_ranks. `body_train` drives one
rank: `rk.build_model(spec, state)` builds the course's TrainNet there (Linear layers with
tanh between them, the output times a buffer `scale`; `forward(x, skip=...)` leaves out the
named square layers), `rk.call(rk.impl.DDP, model, ...)` wraps it in your DDP (under a
counter of the collectives it calls), and `rk.backward(ddp, model, x, grad_output=g, ...)`
runs forward, backward with `grad_output` (inside `ddp.no_sync()` if asked) and a plain SGD
step, and returns the gradients, the parameters and the ordered log of events (a gradient
ready, a collective launched, a wait). The oracle is one TrainNet in float64 trained on the
concatenated batch with `grad_output = cat(g_r) / W`. Run: pytest labs/07
"""
import math

import pytest
import torch

from harness.toolkit import TrainNet, expect_raises, run_ranks

MiB = 2 ** 20


def layer(name, n_in, n_out):
    return {"name": name, "in": n_in, "out": n_out, "bias": True, "dtype": "float32", "frozen": False}


# parameters in module.parameters() order: a.weight, a.bias, b.weight, b.bias, c.weight, c.bias
SPEC = {"layers": [layer("a", 5, 8), layer("b", 8, 8), layer("c", 8, 2)]}
# gradient bytes: a.weight 160, a.bias 32, b.weight 256, b.bias 32, c.weight 64, c.bias 8
CAP_256_B = 256 / MiB
BUCKETS_256_B = [["layers.c.bias", "layers.c.weight", "layers.b.bias"],  # 104 bytes; + b.weight would be 360
                 ["layers.b.weight"],                                     # 256 bytes: the bucket is full
                 ["layers.a.bias", "layers.a.weight"]]                    # 192 bytes
BUCKETS_0 = [["layers.c.bias"], ["layers.c.weight"], ["layers.b.bias"], ["layers.b.weight"],
             ["layers.a.bias"], ["layers.a.weight"]]


def initial_states(spec, seed, W):
    """Rank r starts from its own weights (seed + r) and its own buffer ``scale``: only a
    broadcast from rank 0 makes the replicas equal."""
    states = []
    with torch.random.fork_rng():
        for r in range(W):
            torch.manual_seed(seed + r)
            net = TrainNet(spec)
            with torch.no_grad():
                net.scale.copy_(torch.linspace(0.5, 1.5, net.scale.numel()) + r)
            states.append(dict(net.state_dict()))
    return states


def make_steps(spec, seed, W, n, batch=3, **step):
    """``n`` steps; each holds every rank's input ``x`` and ``grad_output`` ``g`` (per rank)."""
    gen = torch.Generator().manual_seed(seed)
    n_in, n_out = spec["layers"][0]["in"], spec["layers"][-1]["out"]
    return [dict({"x": [torch.randn(batch, n_in, generator=gen) for _ in range(W)],
                  "g": [torch.randn(batch, n_out, generator=gen) for _ in range(W)]}, **step) for _ in range(n)]


def body_train(rk, spec, states, cap, steps):
    model = rk.build_model(spec, states[rk.rank])
    made = rk.call(rk.impl.DDP, model, bucket_cap_mb=cap)
    ddp = made.out
    out = {"buckets": ddp.buckets, "init_comm": made.comm["collectives"], "steps": []}
    for st in steps:
        kwargs = {"skip": list(st["skip"][rk.rank])} if st.get("skip") else {}
        s = rk.backward(ddp, model, st["x"][rk.rank], grad_output=st["g"][rk.rank], lr=st.get("lr"),
                        no_sync=st.get("no_sync", False), **kwargs)
        out["steps"].append({"grads": s.grads, "params": s.params, "events": s.events,
                             "collectives": s.comm["collectives"]})
    return out


def oracle(spec, state, steps):
    """Single-process float64 training on the concatenated batch (rank 0's initial state)."""
    net = TrainNet(spec)
    net.load_state_dict(state)
    net.double()
    out = []
    for st in steps:
        W = len(st["x"])
        if st.get("skip"):  # each rank's samples take their own path through the model
            for x, g, skip in zip(st["x"], st["g"], st["skip"]):
                net(x, skip=list(skip)).backward(g.double() / W)
        else:
            net(torch.cat(st["x"])).backward(torch.cat(st["g"]).double() / W)
        grads = {n: None if p.grad is None else p.grad.clone() for n, p in net.named_parameters()}
        if st.get("lr"):
            with torch.no_grad():
                for p in net.parameters():
                    if p.grad is not None:
                        p -= st["lr"] * p.grad
                    p.grad = None
        out.append({"grads": grads, "params": {n: p.detach().clone() for n, p in net.named_parameters()}})
    return out


def assert_matches(got: dict, want: dict, what: str):
    for name, exp in want.items():
        g = got.get(name)
        assert g is not None, f"{what}: {name} has no gradient"
        torch.testing.assert_close(g.double(), exp, atol=1e-6, rtol=0,
                                   msg=lambda m: f"{what}: {name} differs from single-process training on the "
                                                 f"concatenated batch\n{m}")


def as_sets(buckets):
    return [sorted(b) for b in buckets]


def numels(spec, buckets):
    sizes = {n: p.numel() for n, p in TrainNet(spec).named_parameters()}
    return [sum(sizes[n] for n in b) for b in buckets]


@pytest.mark.part("A")
def test_gradients_and_steps_match_single_process(impl):
    W, seed = 2, 1207
    states = initial_states(SPEC, seed, W)
    steps = make_steps(SPEC, seed + 50, W, 2, lr=0.1)
    res = run_ranks(body_train, W, SPEC, states, CAP_256_B, steps, impl=impl, timeout=60)
    want = oracle(SPEC, states[0], steps)
    for r in range(W):
        for k, (got, exp) in enumerate(zip(res[r]["steps"], want)):
            assert_matches(got["grads"], exp["grads"], f"rank {r}, gradients after backward {k + 1}")
            assert_matches(got["params"], exp["params"], f"rank {r}, parameters after SGD step {k + 1}")


def body_bad_cap(rk, spec, state, cap):
    model = rk.build_model(spec, state)
    expect_raises(ValueError, f"DDP(model, bucket_cap_mb={cap})", rk.call, rk.impl.DDP, model, bucket_cap_mb=cap)


@pytest.mark.part("A")
def test_bad_bucket_cap_raises(impl):
    state = initial_states(SPEC, 3170, 1)[0]
    run_ranks(body_bad_cap, 1, SPEC, state, -1, impl=impl, timeout=60)
    run_ranks(body_bad_cap, 1, SPEC, state, math.nan, impl=impl, timeout=60)


@pytest.mark.part("B")
def test_buckets_and_one_all_reduce_per_bucket(impl):
    W = 2
    states = initial_states(SPEC, 4411, W)
    steps = make_steps(SPEC, 4412, W, 1)
    res = run_ranks(body_train, W, SPEC, states, CAP_256_B, steps, impl=impl, timeout=60)
    want_numel = numels(SPEC, BUCKETS_256_B)
    for r in range(W):
        got = res[r]["buckets"]
        assert as_sets(got) == as_sets(BUCKETS_256_B), (f"rank {r}: bucket_cap_mb = 256 bytes gives self.buckets "
                                                        f"= {got}, expected {BUCKETS_256_B}")
        step = res[r]["steps"][0]
        events = step["events"]
        launches = [e for e in events if e["k"] == "launch"]
        assert sum(step["collectives"].values()) == len(BUCKETS_256_B), (
            f"rank {r}: one backward called {step['collectives']}: expected one collective per bucket "
            f"({len(BUCKETS_256_B)})")
        assert [e.get("numel") for e in launches] == want_numel, (
            f"rank {r}: the collectives carried {[e.get('numel') for e in launches]} elements, expected "
            f"{want_numel} (each bucket's gradients, bucket 0 first)")
        assert all(e.get("dtype") == "float32" for e in launches), f"rank {r}: {launches}: send float32 as float32"
        first = next(i for i, e in enumerate(events) if e["k"] == "forward_done")
        assert not any(e["k"] == "launch" for e in events[:first]), f"rank {r}: forward must communicate nothing"


@pytest.mark.part("B")
def test_overlap_every_parameter_alone(impl):
    W = 2
    states = initial_states(SPEC, 5903, W)
    steps = make_steps(SPEC, 5904, W, 1)
    res = run_ranks(body_train, W, SPEC, states, 0, steps, impl=impl, timeout=60)
    for r in range(W):
        got = res[r]["buckets"]
        assert as_sets(got) == as_sets(BUCKETS_0), f"rank {r}: bucket_cap_mb=0 gives {got}, expected {BUCKETS_0}"
        events = res[r]["steps"][0]["events"]
        launches = [i for i, e in enumerate(events) if e["k"] == "launch"]
        assert len(launches) == len(BUCKETS_0), f"rank {r}: {len(launches)} collectives for {len(BUCKETS_0)} buckets"
        assert all(events[i].get("async_op") for i in launches), f"rank {r}: launch with async_op=True"
        ready = {e["p"]: i for i, e in enumerate(events) if e["k"] == "ready"}
        for b in range(len(BUCKETS_0) - 1):
            later = min(ready[n] for bucket in BUCKETS_0[b + 1:] for n in bucket)
            assert launches[b] < later, (f"rank {r}: bucket {b} {BUCKETS_0[b]} was launched after a gradient of a "
                                         "later bucket was ready: launch each bucket from the hook that completes it")
        waits = [i for i, e in enumerate(events) if e["k"] == "wait"]
        assert not waits or min(waits) > max(ready.values()), (
            f"rank {r}: a wait() happened before the last gradient was ready: never wait inside a hook")


@pytest.mark.part("C")
def test_no_sync_then_average_of_the_sum(impl):
    W, seed = 3, 6217
    states = initial_states(SPEC, seed, W)
    steps = make_steps(SPEC, seed + 1, W, 1, no_sync=True) + make_steps(SPEC, seed + 2, W, 1, lr=0.1)
    res = run_ranks(body_train, W, SPEC, states, CAP_256_B, steps, impl=impl, timeout=60)
    want = oracle(SPEC, states[0], steps)
    for r in range(W):
        inside, after = res[r]["steps"]
        assert not any(e["k"] == "launch" for e in inside["events"]) and not inside["collectives"], (
            f"rank {r}: a backward inside no_sync() called {inside['collectives']}: it must communicate nothing")
        local = TrainNet(SPEC)  # inside no_sync: rank r's own gradient, from rank 0's broadcast weights
        local.load_state_dict(states[0])
        local.double()
        local(steps[0]["x"][r]).backward(steps[0]["g"][r].double())
        assert_matches(inside["grads"], {n: p.grad for n, p in local.named_parameters()},
                       f"rank {r}, gradients inside no_sync (this rank's own)")
        assert_matches(after["grads"], want[1]["grads"],
                       f"rank {r}, gradients of the backward after no_sync (the average of the accumulated sum)")
        assert_matches(after["params"], want[1]["params"], f"rank {r}, parameters after the SGD step")


@pytest.mark.part("C")
def test_unused_parameters_differ_per_rank(impl):
    W, seed = 2, 8093
    states = initial_states(SPEC, seed, W)
    steps = (make_steps(SPEC, seed + 1, W, 1, lr=0.1, skip=[(), ("b",)])
             + make_steps(SPEC, seed + 2, W, 1, lr=0.1, skip=[("b",), ()]))
    res = run_ranks(body_train, W, SPEC, states, CAP_256_B, steps, impl=impl, timeout=30)
    want = oracle(SPEC, states[0], steps)
    for r in range(W):
        for k, (got, exp) in enumerate(zip(res[r]["steps"], want)):
            used = [f"rank {q}" for q, s in enumerate(steps[k]["skip"]) if "b" not in s]
            assert_matches(got["grads"], exp["grads"], f"rank {r}, backward {k + 1} (layer b used by {used} only)")
            assert_matches(got["params"], exp["params"], f"rank {r}, parameters after SGD step {k + 1}")
