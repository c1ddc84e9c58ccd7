"""Hidden graders of lab 08, tensor parallelism (Megatron-LM, the lab 08 contract).

Each case builds the unsharded ``nn.Linear`` layers on W spawned gloo ranks
(``rk.build_linear``, the same weights on every rank), shards them with the
submission's ``from_linear`` / ``from_mlp`` / ``from_attention`` there, and runs one
forward and backward (``rk.backward(..., input_grads=True)``) with the grader's
``grad_output``. The parent computes the unsharded modules in float64 and compares the
output, the input gradient and every parameter's gradient (atol = rtol = 1e-5).

The submission's parameters are found by value, not by name (the contract fixes no
attribute names): each expected shard (rows of a column-parallel weight, input columns
of a row-parallel one, the qkv rows of this rank's heads) must be one parameter's exact
value after construction, and that parameter's gradient must be the same slice of the
unsharded gradient. Communication is read from the event log of collective dispatcher
ops (``c10d`` events: ``dist.*``, ProcessGroup methods, ``torch.distributed.nn`` and
functional collectives all end in one), split at the end of forward.

Where forward or backward raises, the shards are checked first, so a misplaced one is named
before the error it causes. A refusal test (W = 3) first builds the same call on its valid
neighbour and checks its output: no point for refusing alone; one test per family of
refusals, in the part the handout names (from_linear: A; from_mlp, from_attention: B).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.toolkit import View, assert_close, check_one_counter, run_ranks

T = 60.0
ATOL = RTOL = 1e-5
ALL_REDUCE_OPS = ("allreduce_", "all_reduce", "allreduce_coalesced_", "all_reduce_coalesced")


# ----------------------------------------------------------------------------- inputs

def gen(seed, *salt):
    g = torch.Generator()
    g.manual_seed(hash((seed,) + salt) % 2**63)
    return g


def linear_weights(seed, d_in, d_out, bias=True, salt=0):
    g = gen(seed, "linear", d_in, d_out, salt)
    w = torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
    return w, (torch.randn(d_out, generator=g) * 0.1 if bias else None)


def noncontiguous(t: torch.Tensor) -> View:
    """``t``'s values as a non-contiguous view (the last two dims stored transposed)."""
    base = t.transpose(-1, -2).contiguous()
    return View(base, base.transpose(-1, -2))


def blocks(n, W, r):
    return slice(r * n // W, (r + 1) * n // W)


def qkv_rows(d, W, r):
    n = d // W
    return torch.cat([torch.arange(j * d + r * n, j * d + (r + 1) * n) for j in range(3)])


# ----------------------------------------------------------------------------- rank bodies

def body_step(rk, build, layers, x, go, kwargs, members=None, resident=False):
    """Builds the unsharded layers here, shards them with ``build`` (a name of the
    implementation: ``"ColumnParallelLinear.from_linear"``, ...), runs forward and backward;
    with ``members`` (lists of world ranks) in this rank's group of them. Where forward or
    backward raises: ``{"error", "params"}`` (the module's state after construction).
    ``resident``: also ``"growth"``, the rank's live memory (read from outside it) right after
    construction, the unsharded layers' weights dropped, less what it held before they were made."""
    before = rk.resident_bytes(rk.impl) if resident else None
    handles = [rk.build_linear(w, b) for w, b in layers]
    if "activation" in kwargs:  # a dotted torch function name: its handle in the rank's process
        kwargs = {**kwargs, "activation": rk.torch_function(kwargs["activation"])}
    if members is not None:
        kwargs = {**kwargs, "group": next(g for g in rk.new_groups(members) if g is not None)}
    owner, _, method = build.partition(".")
    ctor = getattr(getattr(rk.impl, owner), method) if method else getattr(rk.impl, owner)
    m = rk.call(ctor, *handles, **kwargs).out
    growth, early = None, None
    if before is not None:
        early = rk.reachable_bytes(m)["total"]  # while the unsharded layers are whole
        for h in handles:  # the unsharded layers are the grader's: only the shards stay
            h.weight, h.bias = None, None
        after = rk.resident_bytes(m)
        growth = None if after is None else after - before
    xr, gr = x[rk.rank] if isinstance(x, list) else x, go[rk.rank] if isinstance(go, list) else go
    try:
        s = rk.backward(m, m, xr, grad_output=gr, input_grads=True)
    except Exception as e:  # noqa: BLE001 - graded: the shards are checked first, then this error named
        if type(e).__module__.startswith("harness."):
            raise
        return {"error": f"{type(e).__name__}: {str(e)[:300]}", "params": rk.state(m)}
    storage = rk.reachable_bytes(m)
    return {"out": s.out, "dx": s.input_grads[0], "params": s.params, "grads": s.grads, "events": s.events,
            "reachable": max(storage["total"], early or 0), "largest": storage["largest"], "growth": growth}


def body_function(rk, name, x, go):
    """``copy_to_tp`` / ``reduce_from_tp`` on this rank's own ``x`` and ``grad_output``, and
    whether the call changed ``x``."""
    xr, gr = x[rk.rank], go[rk.rank]
    c = rk.call(getattr(rk.impl, name), xr)
    try:
        s = rk.backward(getattr(rk.impl, name), None, xr, grad_output=gr, input_grads=True)
    except Exception as e:  # noqa: BLE001 - graded after x_after
        if type(e).__module__.startswith("harness."):
            raise
        return {"error": f"{type(e).__name__}: {str(e)[:300]}", "x_after": c.args[0]}
    return {"out": s.out, "dx": s.input_grads[0], "x_after": c.args[0], "events": s.events}


def run(impl, W, body, *args):
    return run_ranks(body, W, *args, impl=impl, timeout=T)


# ----------------------------------------------------------------------------- checks

def raise_error(out, case):
    """The error a rank's forward or backward raised (see :func:`body_step`), if any."""
    if "error" in out:
        raise AssertionError(f"{case}: forward and backward raised {out['error']}")


def find_param(params: dict, want: torch.Tensor, what: str, case: str, hints=()):
    """The name of the parameter whose value is exactly ``want``; else an AssertionError
    naming what would have matched (``hints``: (tensor, bug) pairs)."""
    for n, p in params.items():
        if tuple(p.shape) == tuple(want.shape) and torch.equal(p.to(want.dtype), want):
            return n
    for t, bug in hints:
        if any(tuple(p.shape) == tuple(t.shape) and torch.equal(p.to(t.dtype), t) for p in params.values()):
            raise AssertionError(f"{case}: {what}: a parameter holds {bug}")
    shapes = {n: tuple(p.shape) for n, p in params.items()}
    raise AssertionError(f"{case}: {what} {tuple(want.shape)} is not any parameter's value after construction "
                         f"(parameters: {shapes})")


def find_rows(params: dict, want: torch.Tensor, what: str, case: str, hints=()):
    """Like :func:`find_param`, but the shard may also be several parameters whose rows, stacked,
    are ``want`` (e.g. q, k and v kept apart): returns a list of names in row order."""
    try:
        return [find_param(params, want, what, case, hints)]
    except AssertionError as first:
        names, row = [], 0
        while row < want.shape[0]:
            hit = next((n for n, p in params.items() if n not in names and p.dim() == want.dim() and
                        tuple(p.shape[1:]) == tuple(want.shape[1:]) and 0 < p.shape[0] <= want.shape[0] - row and
                        torch.equal(p.to(want.dtype), want[row:row + p.shape[0]])), None)
            if hit is None:
                raise first from None
            names.append(hit)
            row += params[hit].shape[0]
        return names


def check_grad(res, name, want, what, case, W):
    names = name if isinstance(name, list) else [name]
    missing = [n for n in names if res["grads"].get(n) is None]
    if missing:
        raise AssertionError(f"{case}: {what} ({', '.join(missing)}) has no gradient after backward")
    g = torch.cat([res["grads"][n] for n in names]) if len(names) > 1 else res["grads"][names[0]]
    grad_or_off_by_w(g, want, W, f"the gradient of {what} ({', '.join(names)})", case)


def grad_or_off_by_w(got, want, W, what, case):
    if got is not None and W > 1 and got.shape == want.shape and torch.allclose(got.double(), want * W,
                                                                                 atol=ATOL * W, rtol=RTOL):
        raise AssertionError(f"{case}: {what} is W={W} times the unsharded one: an all-reduce too many (f and g "
                             "swapped, or a replicated gradient summed over the ranks)")
    if got is not None and W > 1 and got.shape == want.shape and torch.allclose(got.double() * W, want,
                                                                                 atol=ATOL * W, rtol=RTOL):
        raise AssertionError(f"{case}: {what} is 1/W of the unsharded one: a missing all-reduce (f's backward "
                             "must sum the ranks' partial input gradients) or a replicated tensor split over the "
                             "ranks (e.g. bias / W added on every rank)")
    assert_close(got, want, atol=ATOL, rtol=RTOL, what=what, case=case)


def collectives(events):
    """(forward, backward) lists of (op, elements) of the collective dispatcher ops."""
    marks = [e["k"] for e in events]
    cut = marks.index("forward_done") if "forward_done" in marks else len(events)
    ops = [(i, (e.get("op"), e.get("numel"))) for i, e in enumerate(events) if e["k"] == "c10d"]
    return [o for i, o in ops if i < cut], [o for i, o in ops if i > cut]


def vjp64(fn, inputs, go):
    """Float64 output and gradients of ``fn(*inputs)`` with ``grad_output`` ``go``."""
    leaves = [t.double().clone().requires_grad_(True) if t is not None else None for t in inputs]
    out = fn(*leaves)
    out.backward(go.double())
    return out.detach(), [t.grad if t is not None else None for t in leaves]


# ----------------------------------------------------------------------------- Part A: f and g

@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [1, 2, 4], ids=lambda w: f"W{w}")
def test_copy_to_tp_is_identity_forward_and_all_reduce_backward(W, impl, seed):
    xs = [torch.randn(3, 4, 5, generator=gen(seed, "x", r)) for r in range(W)]
    gs = [torch.randn(3, 4, 5, generator=gen(seed, "g", r)) for r in range(W)]
    res = run(impl, W, body_function, "copy_to_tp", [noncontiguous(x) for x in xs], [noncontiguous(g) for g in gs])
    for r, out in enumerate(res):
        case = f"copy_to_tp, W={W}, rank {r}, non-contiguous x and gradient"
        raise_error(out, case)
        assert_close(out["out"], xs[r], atol=0, rtol=0, what="forward (identity)", case=case)
        if W > 1 and isinstance(out["dx"], torch.Tensor) and torch.equal(out["dx"].double(), gs[r].double()):
            raise AssertionError(f"{case}: the gradient of x is this rank's own incoming gradient: f's backward "
                                 "must all-reduce (sum) the gradient over the ranks")
        grad_or_off_by_w(out["dx"], sum(g.double() for g in gs), W, "the gradient of x (the sum over the ranks)",
                         case)


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [1, 2, 4], ids=lambda w: f"W{w}")
def test_reduce_from_tp_is_all_reduce_forward_and_identity_backward(W, impl, seed):
    xs = [torch.randn(2, 6, 3, generator=gen(seed, "x", r)) for r in range(W)]
    gs = [torch.randn(2, 6, 3, generator=gen(seed, "g", r)) for r in range(W)]
    res = run(impl, W, body_function, "reduce_from_tp", [noncontiguous(x) for x in xs], [noncontiguous(g) for g in gs])
    for r, out in enumerate(res):
        case = f"reduce_from_tp, W={W}, rank {r}, non-contiguous x and gradient"
        total = sum(x.double() for x in xs)
        if W > 1 and torch.allclose(out["x_after"].double(), total.transpose(-1, -2), atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}: reduce_from_tp overwrote x with the sum (an all-reduce in place of x "
                                 "itself): all-reduce a copy and return it, leaving x unchanged")
        assert_close(out["x_after"], xs[r].transpose(-1, -2).contiguous(), atol=0, rtol=0,
                     what="x after the call (a new tensor; x unchanged)", case=case)
        raise_error(out, case)
        assert_close(out["out"], total, atol=ATOL, rtol=RTOL, what="forward (the sum)", case=case)
        grad_or_off_by_w(out["dx"], gs[r].double(), W, "the gradient of x (identity)", case)


# ----------------------------------------------------------------------------- Part A: linears

def column_case(impl, seed, W, d_in, d_out, bias, gather):
    w, b = linear_weights(seed, d_in, d_out, bias)
    x = torch.randn(2, 3, d_in, generator=gen(seed, "x"))
    go = torch.randn(2, 3, d_out, generator=gen(seed, "g"))
    ref, (dx, dw, db) = vjp64(lambda x_, w_, b_: F.linear(x_, w_, b_), [x, w, b], go)
    if gather:
        grad_outs = go
    else:
        grad_outs = [go[..., blocks(d_out, W, r)].contiguous() for r in range(W)]
    res = run(impl, W, body_step, "ColumnParallelLinear.from_linear", [(w, b)], x, grad_outs,
              {"gather_output": gather})
    for r, out in enumerate(res):
        rows = blocks(d_out, W, r)
        case = f"ColumnParallelLinear, W={W}, rank {r}, gather_output={gather}, bias={bias}"
        wn = find_param(out["params"], w[rows], f"weight rows [{rows.start}, {rows.stop})", case,
                        hints=[(w[:, blocks(d_in, W, r)], "input columns: split along the wrong axis (a column-"
                                "parallel linear splits the output features, weight rows)")] if W > 1 else ())
        bn = find_param(out["params"], b[rows], f"bias entries [{rows.start}, {rows.stop})", case) if bias else None
        if not bias and any(p.dim() == 1 for p in out["params"].values()):
            raise AssertionError(f"{case}: a bias parameter exists for a Linear without bias (bias must be None)")
        raise_error(out, case)
        want = ref if gather else ref[..., rows]
        summed = F.linear(W * x.double(), w.double(), None if b is None else b.double())
        if W > 1 and torch.allclose(out["out"].double(), summed if gather else summed[..., rows], atol=ATOL,
                                    rtol=RTOL):
            raise AssertionError(f"{case}: the output is that of W={W} times x: the input was all-reduced in forward "
                                 "(f and g swapped: copy_to_tp, f, is the identity in forward; reduce_from_tp, g, "
                                 "sums a row-parallel layer's partial products)")
        assert_close(out["out"], want, atol=ATOL, rtol=RTOL, what="output", case=case)
        grad_or_off_by_w(out["dx"], dx, W, "the gradient of x (replicated: the full gradient on every rank)", case)
        check_grad(out, wn, dw[rows], "the weight shard", case, W)
        if bias:
            check_grad(out, bn, db[rows], "the bias shard", case, W)


@pytest.mark.part("A")
@pytest.mark.points(3)
@pytest.mark.parametrize("W", [1, 2, 4], ids=lambda w: f"W{w}")
def test_column_parallel_linear_matches_the_unsharded_layer(W, impl, seed):
    column_case(impl, seed, W, 6, 8, True, False)


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W, bias", [(2, True), (4, False)], ids=["W2", "W4-no-bias"])
def test_column_parallel_gather_output(W, bias, impl, seed):
    column_case(impl, seed, W, 5, 12, bias, True)


def row_case(impl, seed, W, d_in, d_out, bias, parallel_input):
    w, b = linear_weights(seed, d_in, d_out, bias, salt=1)
    x = torch.randn(2, 3, d_in, generator=gen(seed, "xr"))
    go = torch.randn(2, 3, d_out, generator=gen(seed, "gr"))
    ref, (dx, dw, db) = vjp64(lambda x_, w_, b_: F.linear(x_, w_, b_), [x, w, b], go)
    xs = [x[..., blocks(d_in, W, r)].contiguous() for r in range(W)] if parallel_input else x
    res = run(impl, W, body_step, "RowParallelLinear.from_linear", [(w, b)], xs, go,
              {"input_is_parallel": parallel_input})
    for r, out in enumerate(res):
        cols = blocks(d_in, W, r)
        case = f"RowParallelLinear, W={W}, rank {r}, input_is_parallel={parallel_input}, bias={bias}"
        wn = find_param(out["params"], w[:, cols], f"weight input columns [{cols.start}, {cols.stop})", case,
                        hints=[(w[blocks(d_out, W, r)], "output rows: split along the wrong axis (a row-parallel "
                                "linear splits the input features, weight columns)")] if W > 1 else ())
        bn = find_param(out["params"], b, "the full bias", case) if bias else None
        raise_error(out, case)
        check_grad(out, wn, dw[:, cols], "the weight shard", case, W)
        if bias:
            grad_or_off_by_w(out["grads"][bn], db, W, f"the bias gradient ({bn}; the full one on every rank)", case)
        if W > 1 and bias and torch.allclose(out["out"].double(), ref + (W - 1) * b.double(), atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}: the output holds the bias W={W} times: add the full bias once, after the "
                                 "all-reduce (not on every rank before it)")
        assert_close(out["out"], ref, atol=ATOL, rtol=RTOL, what="output (the full one on every rank)", case=case)
        own = torch.zeros_like(dx)   # this rank's columns of the full gradient, zeros elsewhere
        own[..., cols] = dx[..., cols]
        if not parallel_input and W > 1 and isinstance(out["dx"], torch.Tensor) and out["dx"].shape == dx.shape and \
                torch.allclose(out["dx"].double(), own, atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}: the gradient of x holds only this rank's columns [{cols.start}, "
                                 f"{cols.stop}) (zeros elsewhere): with input_is_parallel=False the backward must "
                                 "all-gather the blocks' gradients into the full one")
        grad_or_off_by_w(out["dx"], dx[..., cols] if parallel_input else dx, W,
                         "the gradient of x" + (" (this rank's columns)" if parallel_input else " (all-gathered)"), case)


@pytest.mark.part("A")
@pytest.mark.points(3)
@pytest.mark.parametrize("W", [1, 2, 4], ids=lambda w: f"W{w}")
def test_row_parallel_linear_matches_the_unsharded_layer(W, impl, seed):
    row_case(impl, seed, W, 8, 6, True, True)


@pytest.mark.part("A")
@pytest.mark.points(2)
@pytest.mark.parametrize("W, bias", [(2, True), (4, False)], ids=["W2", "W4-no-bias"])
def test_row_parallel_full_input(W, bias, impl, seed):
    row_case(impl, seed, W, 12, 5, bias, False)


def body_refusal(rk, build, valid, refused, x):
    """``build`` (a name of the implementation) on the ``valid`` neighbour's layers and that
    module's forward on ``x`` (this rank's, when a list), then ``build`` on the ``refused``
    layers: ``(("ok", output) or (exception type, message), (exception type, message))``.
    ``valid`` and ``refused`` are ``(layers, kwargs)``, ``layers`` a list of (weight, bias)."""
    owner, _, method = build.partition(".")
    ctor = getattr(getattr(rk.impl, owner), method)
    outcome = []
    for i, (layers, kwargs) in enumerate((valid, refused)):
        try:
            m = rk.call(ctor, *[rk.build_linear(w, b) for w, b in layers], **kwargs).out
            outcome.append(("ok", rk.call(m, x[rk.rank] if isinstance(x, list) else x).out) if i == 0
                           else ("no error", ""))
        except Exception as e:  # noqa: BLE001 - the type and message are graded
            if type(e).__module__.startswith("harness."):
                raise
            outcome.append((type(e).__name__, str(e)))
    return outcome


def refusal_case(impl, seed, build, valid, refused, words, oracle):
    """One refusal at W = 3: first ``build`` on the ``valid`` neighbour (the same call with the
    offending size made valid) must be accepted and its forward must equal ``oracle`` (a
    function of the neighbour's float64 weights, x and the rank); then ``build`` on the
    ``refused`` sizes must raise ValueError whose message holds ``words``. ``valid`` and
    ``refused``: ``(sizes, kwargs)``, sizes a list of (in, out)."""
    W = 3
    case = f"{build}, W={W}, " + ", ".join(f"Linear({i}, {o})" for i, o in refused[0]) + \
        "".join(f", {k}={v}" for k, v in refused[1].items())
    neighbour = f"{build}, W={W}, " + ", ".join(f"Linear({i}, {o})" for i, o in valid[0]) + \
        "".join(f", {k}={v}" for k, v in valid[1].items())
    vl = [linear_weights(seed, i, o, salt=10 + n) for n, (i, o) in enumerate(valid[0])]
    rl = [linear_weights(seed, i, o, salt=20 + n) for n, (i, o) in enumerate(refused[0])]
    x = torch.randn(2, 3, valid[0][0][0], generator=gen(seed, "x-refusal", build))
    sent = [x[..., blocks(x.shape[-1], W, r)].contiguous() for r in range(W)] if build.startswith("Row") else x
    res = run(impl, W, body_refusal, build, (vl, valid[1]), (rl, refused[1]), sent)
    for r, ((kind, out), (err, msg)) in enumerate(res):
        assert kind == "ok", f"{neighbour}, rank {r} (the valid neighbour of {case}): raised {kind}: {out[:200]}; " \
                             "only sizes that do not fit may be refused"
        assert_close(out, oracle(vl, x, r), atol=ATOL, rtol=RTOL, case=f"{neighbour}, rank {r}",
                     what=f"the output of the valid neighbour of {case} (checked before the refusal)")
        assert err == "ValueError", f"{case}, rank {r}: " + ("nothing was raised" if err == "no error" else
                                                             f"raised {err}: {msg[:200]}") + \
            "; the contract's error for a size that does not fit is ValueError"
        assert all(w in msg for w in words), f"{case}, rank {r}: the message {msg[:200]!r} must name the argument " \
                                             f"and its value ({', '.join(words)})"


def column_oracle(layers, x, r):
    (w, b), = layers
    return F.linear(x.double(), w.double(), b.double())[..., blocks(w.shape[0], 3, r)]


def row_oracle(layers, x, r):
    (w, b), = layers
    return F.linear(x.double(), w.double(), b.double())


# Refusals: id -> (build, (sizes, kwargs) of the valid neighbour, (sizes, kwargs) refused, words)
LINEAR_REFUSALS = {
    "column-out_features=10": ("ColumnParallelLinear.from_linear", ([(5, 9)], {}), ([(5, 10)], {}),
                               ["out_features", "10"]),
    "row-in_features=10": ("RowParallelLinear.from_linear", ([(9, 5)], {}), ([(10, 5)], {}), ["in_features", "10"]),
}


@pytest.mark.part("A")
@pytest.mark.points(1)
@pytest.mark.parametrize("which", LINEAR_REFUSALS)
def test_from_linear_refuses_a_split_not_divisible_by_W(which, impl, seed):
    build, valid, refused, words = LINEAR_REFUSALS[which]
    refusal_case(impl, seed, build, valid, refused, words, column_oracle if which.startswith("column") else row_oracle)


# ----------------------------------------------------------------------------- Part B

ACTIVATIONS = {None: F.gelu, "torch.nn.functional.relu": F.relu, "torch.nn.functional.silu": F.silu}


def mlp_ref(activation=None):
    act = ACTIVATIONS[activation]
    return lambda x, w1, b1, w2, b2: F.linear(act(F.linear(x, w1, b1)), w2, b2)


def attention_ref(n_heads, causal):
    def f(x, wqkv, bqkv, wp, bp):
        B, L, d = x.shape
        q, k, v = (t.view(B, L, n_heads, d // n_heads).transpose(1, 2) for t in F.linear(x, wqkv, bqkv).split(d, -1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return F.linear(o.transpose(1, 2).reshape(B, L, d), wp, bp)
    return f


def blocks_oracle(ref):
    """An oracle for :func:`refusal_case` from a float64 reference of the unsharded block."""
    return lambda layers, x, r: ref(x.double(), *(t.double() for w, b in layers for t in (w, b)))


MLP_REFUSALS = {
    "fc1.out_features=10": (([(7, 12), (12, 7)], {}), ([(7, 10), (10, 7)], {}), ["out_features", "10"]),
    "fc2.in_features=9-not-fc1.out_features=6": (([(7, 6), (6, 7)], {}), ([(7, 6), (9, 7)], {}),
                                                  ["in_features", "9"]),
}


@pytest.mark.part("B")
@pytest.mark.points(1)
@pytest.mark.parametrize("which", MLP_REFUSALS)
def test_from_mlp_refuses_sizes_that_do_not_fit(which, impl, seed):
    valid, refused, words = MLP_REFUSALS[which]
    refusal_case(impl, seed, "ParallelMLP.from_mlp", valid, refused, words, blocks_oracle(mlp_ref()))


ATTENTION_REFUSALS = {  # d = qkv.in_features
    "n_heads=5": (([(30, 90), (30, 30)], {"n_heads": 6}), ([(30, 90), (30, 30)], {"n_heads": 5}), ["n_heads", "5"]),
    "d=14-n_heads=3": (([(15, 45), (15, 15)], {"n_heads": 3}), ([(14, 42), (14, 14)], {"n_heads": 3}),
                       ["n_heads", "3"]),
    "qkv.out_features=33": (([(12, 36), (12, 12)], {"n_heads": 3}), ([(12, 33), (12, 12)], {"n_heads": 3}),
                            ["out_features", "33"]),
    "proj.in_features=9": (([(12, 36), (12, 12)], {"n_heads": 3}), ([(12, 36), (9, 12)], {"n_heads": 3}),
                           ["in_features", "9"]),
}


@pytest.mark.part("B")
@pytest.mark.points(0.5)
@pytest.mark.parametrize("which", ATTENTION_REFUSALS)
def test_from_attention_refuses_sizes_that_do_not_fit(which, impl, seed):
    valid, refused, words = ATTENTION_REFUSALS[which]
    refusal_case(impl, seed, "ParallelAttention.from_attention", valid, refused, words,
                 blocks_oracle(attention_ref(valid[1]["n_heads"], True)))


def mlp_case(impl, seed, W, d=8, hidden=16, B=2, L=3, members=None, activation=None, strided=False):
    """``activation``: a dotted name in ``ACTIVATIONS`` passed to ``from_mlp`` (None: its
    default, GELU); ``strided``: x and grad_output sent as non-contiguous views."""
    (w1, b1), (w2, b2) = linear_weights(seed, d, hidden, salt=2), linear_weights(seed, hidden, d, salt=3)
    x, go = torch.randn(B, L, d, generator=gen(seed, "xm")), torch.randn(B, L, d, generator=gen(seed, "gm"))
    ref, (dx, dw1, db1, dw2, db2) = vjp64(mlp_ref(activation), [x, w1, b1, w2, b2], go)
    world = W if members is None else sum(len(m) for m in members)
    kwargs = {} if activation is None else {"activation": activation}
    sent = (noncontiguous(x), noncontiguous(go)) if strided else (x, go)
    res = run(impl, world, body_step, "ParallelMLP.from_mlp", [(w1, b1), (w2, b2)], *sent, kwargs, members)
    gelu_ref = vjp64(mlp_ref(), [x, w1, b1, w2, b2], go)[0] if activation is not None else None
    for g, out in enumerate(res):
        r = g if members is None else next(m.index(g) for m in members if g in m)
        h = blocks(hidden, W, r)
        case = f"ParallelMLP, W={W}, rank {r}" + ("" if members is None else f" of group {members} (world rank {g})")
        case += (f", activation={activation.rsplit('.', 1)[1]}" if activation else "") + \
            (", non-contiguous x and gradient" if strided else "")
        world_rows = [(w1[blocks(hidden, world, g)], f"the rows of a split over the whole world (W={world}), not "
                       f"over the group (W={W})")] if members is not None else ()
        shards = [(find_param(out["params"], want, f"{what} [{h.start}, {h.stop})", case,
                              hints=world_rows if what == "fc1 weight rows" else ()), grad, what)
                  for want, grad, what in ((w1[h], dw1[h], "fc1 weight rows"), (b1[h], db1[h], "fc1 bias entries"),
                                           (w2[:, h], dw2[:, h], "fc2 weight input columns"))]
        bn = find_param(out["params"], b2, "the full fc2 bias", case)
        raise_error(out, case)
        if gelu_ref is not None and torch.allclose(out["out"].double(), gelu_ref, atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}: the output is the GELU MLP's: the activation argument of from_mlp "
                                 "is ignored (GELU hard-coded)")
        for name, grad, what in shards:
            check_grad(out, name, grad, what, case, W)
        grad_or_off_by_w(out["grads"][bn], db2, W, "the fc2 bias gradient", case)
        if W > 1 and torch.allclose(out["out"].double(), ref + (W - 1) * b2.double(), atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}: the output holds fc2's bias W={W} times: add it once, after the all-reduce")
        assert_close(out["out"], ref, atol=ATOL, rtol=RTOL, what="output", case=case)
        grad_or_off_by_w(out["dx"], dx, W, "the gradient of x", case)
    return res, (B * L * d)


def global_heads_ref(x, wq, bq, wp, bp, n_heads, W, causal, fold):
    """Float64 output of the attention block whose rank r views its q, k and v, ``(B, L, d/W)``
    each, with the global head count ``n_heads``: ``fold="L"`` as ``(B, -1, n_heads, D)`` (runs
    when W divides L), ``fold="D"`` as ``(B, L, n_heads, -1)`` (runs when W divides D). None
    where that reshape would fail."""
    B, L, d = x.shape
    D, n = d // n_heads, d // W
    if (fold == "L" and L % W) or (fold == "D" and D % W):
        return None
    y = bp.double()
    for r in range(W):
        rows = qkv_rows(d, W, r)
        t = F.linear(x.double(), wq[rows].double(), bq[rows].double())
        shape = (B, -1, n_heads, D) if fold == "L" else (B, L, n_heads, -1)
        q, k, v = (u.reshape(shape).transpose(1, 2) for u in t.split(n, -1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(B, L, n)
        y = y + F.linear(o, wp[:, r * n:(r + 1) * n].double())
    return y


def check_heads_are_local(got, ref, x, layers, n_heads, W, causal, case):
    """Names the bug when ``got`` (a rank's output) is not ``ref`` but the output of heads
    reshaped with the global head count (:func:`global_heads_ref`)."""
    if W == 1 or not isinstance(got, torch.Tensor) or got.shape != ref.shape or \
            torch.allclose(got.double(), ref, atol=ATOL, rtol=RTOL):
        return
    B, L, d = x.shape
    for fold, view in (("L", f"(B, -1, n_heads={n_heads}, D)"), ("D", f"(B, L, n_heads={n_heads}, -1)")):
        bug = global_heads_ref(x, *layers, n_heads, W, causal, fold)
        if bug is not None and torch.allclose(got.double(), bug, atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}, B={B}, L={L}, d={d}: the heads were reshaped with the global head count: "
                                 f"the output is that of q, k and v viewed {view}; a rank holds n_heads/W = "
                                 f"{n_heads // W} heads, its q, k, v are (B, L, d/W): view them (B, L, n_heads/W, D)")


def attention_case(impl, seed, W, causal, d=16, n_heads=4, B=2, L=5, strided=False):
    (wq, bq), (wp, bp) = linear_weights(seed, d, 3 * d, salt=4), linear_weights(seed, d, d, salt=5)
    x, go = torch.randn(B, L, d, generator=gen(seed, "xa")), torch.randn(B, L, d, generator=gen(seed, "ga"))
    ref, (dx, dwq, dbq, dwp, dbp) = vjp64(attention_ref(n_heads, causal), [x, wq, bq, wp, bp], go)
    sent = (noncontiguous(x), noncontiguous(go)) if strided else (x, go)
    res = run(impl, W, body_step, "ParallelAttention.from_attention", [(wq, bq), (wp, bp)], *sent,
              {"n_heads": n_heads, "is_causal": causal})
    D = d // n_heads
    for r, out in enumerate(res):
        rows = qkv_rows(d, W, r)
        case = f"ParallelAttention, W={W}, rank {r}, is_causal={causal}" + \
            (", non-contiguous x and gradient" if strided else "")
        robin = torch.cat([torch.arange(j * d + hd * D, j * d + (hd + 1) * D) for j in range(3)
                           for hd in range(r, n_heads, W)])
        hints = [(wq[blocks(3 * d, W, r)], "one contiguous block of 3d/W qkv rows (rank r's rows are j*d + "
                  "[r*d/W, (r+1)*d/W) for j = 0, 1, 2: its heads' q, k and v)"),
                 (wq[robin], "heads assigned round-robin (rank r holds heads [r*H/W, (r+1)*H/W), in blocks)")] \
            if W > 1 else []
        qn = find_rows(out["params"], wq[rows], "qkv weight rows of this rank's heads", case, hints=hints)
        bn = find_rows(out["params"], bq[rows], "qkv bias entries of this rank's heads", case)
        cols = blocks(d, W, r)
        pn = find_param(out["params"], wp[:, cols], f"proj weight input columns [{cols.start}, {cols.stop})", case)
        ppn = find_param(out["params"], bp, "the full proj bias", case)
        raise_error(out, case)
        check_heads_are_local(out["out"], ref, x, (wq, bq, wp, bp), n_heads, W, causal, case)
        check_grad(out, qn, dwq[rows], "the qkv weight shard", case, W)
        check_grad(out, bn, dbq[rows], "the qkv bias shard", case, W)
        check_grad(out, pn, dwp[:, cols], "the proj weight shard", case, W)
        grad_or_off_by_w(out["grads"][ppn], dbp, W, "the proj bias gradient", case)
        assert_close(out["out"], ref, atol=ATOL, rtol=RTOL, what="output", case=case)
        grad_or_off_by_w(out["dx"], dx, W, "the gradient of x", case)
    return res, B * L * d


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("W", [1, 2, 4], ids=lambda w: f"W{w}")
def test_parallel_mlp_matches_the_unsharded_mlp(W, impl, seed):
    mlp_case(impl, seed, W)


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_parallel_mlp_applies_the_activation_it_is_given(activation, impl, seed):
    mlp_case(impl, seed, 2, activation=f"torch.nn.functional.{activation}")


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_non_contiguous_inputs_and_gradients(impl, seed):
    """x and the gradient reaching backward as transposed views (a ``.view`` of them fails:
    use ``reshape`` or work on the last dim)."""
    mlp_case(impl, seed, 2, strided=True)
    attention_case(impl, seed, 2, True, strided=True)


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_group_is_honoured(impl, seed):
    """W=4 split into groups {0, 1} and {2, 3}: each group shards the MLP over its own 2 ranks."""
    try:
        mlp_case(impl, seed, 2, members=[[0, 1], [2, 3]])
    except AssertionError as e:
        raise AssertionError(f"{e}\n(W and r are dist.get_world_size(group) and dist.get_rank(group); every "
                             "collective is issued on group)") from None


@pytest.mark.part("B")
@pytest.mark.points(3)
@pytest.mark.parametrize("W, causal", [(1, True), (2, True), (4, True), (2, False)],
                         ids=["W1-causal", "W2-causal", "W4-causal", "W2-not-causal"])
def test_parallel_attention_matches_the_unsharded_block(W, causal, impl, seed):
    attention_case(impl, seed, W, causal)


@pytest.mark.part("B")
@pytest.mark.points(2)
@pytest.mark.parametrize("W, L", [(2, 6), (4, 8)], ids=["W2-L6", "W4-L8"])
def test_parallel_attention_reshapes_into_this_ranks_heads(W, L, impl, seed):
    """L a multiple of W (and D = 5 odd): here a view of this rank's q, k, v ``(B, L, d/W)`` with
    the global head count, ``(B, -1, n_heads, D)``, runs without error and folds the sequence
    into the heads; the output must still be the unsharded block's."""
    attention_case(impl, seed, W, True, d=20, n_heads=4, B=1, L=L)


# ----------------------------------------------------------------------------- Part C

def check_one_all_reduce_each_way(res, W, n, what):
    for r, out in enumerate(res):
        fwd, bwd = collectives(out["events"])
        case = f"{what}, W={W}, rank {r}"
        check_one_counter(out["events"], case)
        for side, ops in (("forward", fwd), ("backward", bwd)):
            desc = ", ".join(f"{op}({numel})" for op, numel in ops) or "none"
            assert len(ops) == 1, f"{case}: {len(ops)} collective(s) in {side} ({desc}): exactly one all-reduce " \
                                  f"of B*L*d = {n} elements"
            op, numel = ops[0]
            assert op in ALL_REDUCE_OPS and numel == n, f"{case}: {side} sent {desc}: one all-reduce of B*L*d = " \
                                                        f"{n} elements"


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [2, 4], ids=lambda w: f"W{w}")
def test_mlp_one_all_reduce_forward_and_one_backward(W, impl, seed):
    res, n = mlp_case(impl, seed, W)
    check_one_all_reduce_each_way(res, W, n, "ParallelMLP")


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("W", [2, 4], ids=lambda w: f"W{w}")
def test_attention_one_all_reduce_forward_and_one_backward(W, impl, seed):
    res, n = attention_case(impl, seed, W, True)
    check_one_all_reduce_each_way(res, W, n, "ParallelAttention")


def expected_bytes(kind, W, d, hidden):
    f = 4
    if kind == "mlp":  # fc1 rows + fc1 bias shard + fc2 columns + the full fc2 bias
        return f * (hidden * d // W + hidden // W + d * hidden // W + d)
    return f * (3 * d * d // W + 3 * d // W + d * d // W + d)  # qkv rows + bias shard + proj columns + full bias


MiB = 2**20
RESIDENT_MARGIN = 4 * MiB  # allocator and interpreter noise in a rank's live memory (measured: see the report)


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("kind, W", [("mlp", 2), ("mlp", 4), ("attention", 2)], ids=["mlp-W2", "mlp-W4", "attn-W2"])
def test_parameters_hold_one_wth_in_storages_of_their_own(kind, W, impl, seed):
    """The module's parameters and the tensor storage reachable from it (closures, cells, class
    attributes and module globals included) are 1/W of the layers, and so is each rank's live
    memory, read from outside the rank right after construction once the unsharded layers are
    dropped (state hidden from the walk counts there), at d=1024, hidden=4096: an unsharded MLP
    is 32 MiB of weights (its shards 16 or 8 MiB), an attention block 16 MiB (shards 8 MiB)."""
    d, hidden = 1024, 4096
    if kind == "mlp":
        layers = [linear_weights(seed, d, hidden, salt=6), linear_weights(seed, hidden, d, salt=7)]
        build, kw = "ParallelMLP.from_mlp", {}
    else:
        layers = [linear_weights(seed, d, 3 * d, salt=8), linear_weights(seed, d, d, salt=9)]
        build, kw = "ParallelAttention.from_attention", {"n_heads": 4}
    x = torch.randn(1, 2, d, generator=gen(seed, "xs"))
    res = run_ranks(body_step, W, build, layers, x, torch.ones(1, 2, d), kw, None, True, impl=impl, timeout=3 * T)
    want = expected_bytes(kind, W, d, hidden)
    for r, out in enumerate(res):
        case = f"{build.split('.')[0]}, W={W}, rank {r}"
        raise_error(out, case)
        held = sum(p.numel() * p.element_size() for p in out["params"].values())
        assert held == want, f"{case}: the parameters hold {held} bytes, expected {want} (1/W of each sharded weight " \
                             "and column-parallel bias, plus the full row-parallel bias)"
        assert out["reachable"] <= want + 4096, (
            f"{case}: {out['reachable']} bytes of tensor storage are reachable from the module, the shards are {want} "
            f"(largest: {out['largest']}): keep copies of the shards (.clone(), not views of the full weight) and no "
            "reference to the original layers")
        if out["growth"] is not None:
            assert out["growth"] <= want + RESIDENT_MARGIN, (
                f"{case}: the rank's live memory grew by {out['growth'] / MiB:.1f} MiB from before the unsharded "
                f"layers were made (their weights dropped after construction; read outside the rank), the shards are "
                f"{want / MiB:.1f} MiB (+{RESIDENT_MARGIN / MiB:.0f} MiB of allocator noise): the rank keeps the "
                "unsharded weights somewhere (a closure, a module-level dict, a copy): keep only its shards")
