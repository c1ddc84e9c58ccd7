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
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.toolkit import View, assert_close, run_ranks

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

def body_step(rk, build, layers, x, go, kwargs, members=None):
    """Builds the unsharded layers here, shards them with ``build`` (a name of the
    implementation: ``"ColumnParallelLinear.from_linear"``, ...), runs forward and backward;
    with ``members`` (lists of world ranks) in this rank's group of them."""
    handles = [rk.build_linear(w, b) for w, b in layers]
    if "activation" in kwargs:  # a dotted torch function name: its handle in the rank's process
        kwargs = {**kwargs, "activation": rk.torch_function(kwargs["activation"])}
    if members is not None:
        kwargs = {**kwargs, "group": next(g for g in rk.new_groups(members) if g is not None)}
    owner, _, method = build.partition(".")
    ctor = getattr(getattr(rk.impl, owner), method) if method else getattr(rk.impl, owner)
    m = rk.call(ctor, *handles, **kwargs).out
    xr, gr = x[rk.rank] if isinstance(x, list) else x, go[rk.rank] if isinstance(go, list) else go
    s = rk.backward(m, m, xr, grad_output=gr, input_grads=True)
    storage = rk.reachable_bytes(m)
    return {"out": s.out, "dx": s.input_grads[0], "params": s.params, "grads": s.grads, "events": s.events,
            "reachable": storage["total"], "largest": storage["largest"]}


def body_function(rk, name, x, go):
    """``copy_to_tp`` / ``reduce_from_tp`` on this rank's own ``x`` and ``grad_output``, and
    whether the call changed ``x``."""
    xr, gr = x[rk.rank], go[rk.rank]
    c = rk.call(getattr(rk.impl, name), xr)
    s = rk.backward(getattr(rk.impl, name), None, xr, grad_output=gr, input_grads=True)
    return {"out": s.out, "dx": s.input_grads[0], "x_after": c.args[0], "events": s.events}


def run(impl, W, body, *args):
    return run_ranks(body, W, *args, impl=impl, timeout=T)


# ----------------------------------------------------------------------------- checks

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
        assert_close(out["out"], xs[r], atol=0, rtol=0, what="forward (identity)", case=case)
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
        assert_close(out["out"], sum(x.double() for x in xs), atol=ATOL, rtol=RTOL, what="forward (the sum)", case=case)
        assert_close(out["x_after"], xs[r].transpose(-1, -2).contiguous(), atol=0, rtol=0,
                     what="x after the call (a new tensor; x unchanged)", case=case)
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
        assert_close(out["out"], ref if gather else ref[..., rows], atol=ATOL, rtol=RTOL, what="output", case=case)
        grad_or_off_by_w(out["dx"], dx, W, "the gradient of x (replicated: the full gradient on every rank)", case)
        wn = find_param(out["params"], w[rows], f"weight rows [{rows.start}, {rows.stop})", case,
                        hints=[(w[:, blocks(d_in, W, r)], "input columns: split along the wrong axis (a column-"
                                "parallel linear splits the output features, weight rows)")] if W > 1 else ())
        check_grad(out, wn, dw[rows], "the weight shard", case, W)
        if bias:
            bn = find_param(out["params"], b[rows], f"bias entries [{rows.start}, {rows.stop})", case)
            check_grad(out, bn, db[rows], "the bias shard", case, W)
        elif any(p.dim() == 1 for p in out["params"].values()):
            raise AssertionError(f"{case}: a bias parameter exists for a Linear without bias (bias must be None)")


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
        check_grad(out, wn, dw[:, cols], "the weight shard", case, W)
        if bias:
            bn = find_param(out["params"], b, "the full bias", case)
            grad_or_off_by_w(out["grads"][bn], db, W, f"the bias gradient ({bn}; the full one on every rank)", case)
        if W > 1 and bias and torch.allclose(out["out"].double(), ref + (W - 1) * b.double(), atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}: the output holds the bias W={W} times: add the full bias once, after the "
                                 "all-reduce (not on every rank before it)")
        assert_close(out["out"], ref, atol=ATOL, rtol=RTOL, what="output (the full one on every rank)", case=case)
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


def body_errors(rk, cases):
    out = []
    for build, layers, kwargs in cases:
        handles = [rk.build_linear(w, b) for w, b in layers]
        owner, _, method = build.partition(".")
        try:
            rk.call(getattr(getattr(rk.impl, owner), method), *handles, **kwargs)
            out.append(("no error", ""))
        except Exception as e:  # noqa: BLE001 - the type and message are graded
            out.append((type(e).__name__, str(e)))
    return out


ERRORS = [  # (what, build, layer sizes (in, out), kwargs, words the message must hold)
    ("Column out_features=8 at W=3", "ColumnParallelLinear.from_linear", [(4, 8)], {}, ["out_features", "8"]),
    ("Row in_features=8 at W=3", "RowParallelLinear.from_linear", [(8, 4)], {}, ["in_features", "8"]),
    ("MLP fc1.out_features=8 at W=3", "ParallelMLP.from_mlp", [(6, 8), (8, 6)], {}, ["out_features", "8"]),
    ("MLP fc2.in_features=9 != fc1.out_features=6", "ParallelMLP.from_mlp", [(6, 6), (9, 6)], {}, ["in_features", "9"]),
    ("attention n_heads=4 at W=3", "ParallelAttention.from_attention", [(12, 36), (12, 12)], {"n_heads": 4},
     ["n_heads", "4"]),
    ("attention d=10 % n_heads=3", "ParallelAttention.from_attention", [(10, 30), (10, 10)], {"n_heads": 3},
     ["n_heads", "3"]),
    ("attention qkv.out_features=24 != 3d=36", "ParallelAttention.from_attention", [(12, 24), (12, 12)],
     {"n_heads": 3}, ["out_features", "24"]),
    ("attention proj.in_features=6 != d=12", "ParallelAttention.from_attention", [(12, 36), (6, 12)], {"n_heads": 3},
     ["in_features", "6"]),
]


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_sizes_that_do_not_fit_raise_value_error_naming_them(impl, seed):
    cases = [(build, [linear_weights(seed, i, o) for i, o in sizes], kw) for _, build, sizes, kw, _ in ERRORS]
    got = run(impl, 3, body_errors, cases)[0]
    for (what, *_, words), (kind, msg) in zip(ERRORS, got):
        assert kind == "ValueError", f"{what}: {kind} {msg[:200]}, expected ValueError"
        assert all(w in msg for w in words), f"{what}: the message {msg[:200]!r} must name the argument and value " \
                                             f"({', '.join(words)})"


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
        if gelu_ref is not None and torch.allclose(out["out"].double(), gelu_ref, atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}: the output is the GELU MLP's: the activation argument of from_mlp "
                                 "is ignored (GELU hard-coded)")
        for want, grad, what in ((w1[h], dw1[h], "fc1 weight rows"), (b1[h], db1[h], "fc1 bias entries"),
                                 (w2[:, h], dw2[:, h], "fc2 weight input columns")):
            check_grad(out, find_param(out["params"], want, f"{what} [{h.start}, {h.stop})", case), grad, what, case, W)
        bn = find_param(out["params"], b2, "the full fc2 bias", case)
        grad_or_off_by_w(out["grads"][bn], db2, W, "the fc2 bias gradient", case)
        if W > 1 and torch.allclose(out["out"].double(), ref + (W - 1) * b2.double(), atol=ATOL, rtol=RTOL):
            raise AssertionError(f"{case}: the output holds fc2's bias W={W} times: add it once, after the all-reduce")
        assert_close(out["out"], ref, atol=ATOL, rtol=RTOL, what="output", case=case)
        grad_or_off_by_w(out["dx"], dx, W, "the gradient of x", case)
    return res, (B * L * d)


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
        check_grad(out, qn, dwq[rows], "the qkv weight shard", case, W)
        bn = find_rows(out["params"], bq[rows], "qkv bias entries of this rank's heads", case)
        check_grad(out, bn, dbq[rows], "the qkv bias shard", case, W)
        cols = blocks(d, W, r)
        pn = find_param(out["params"], wp[:, cols], f"proj weight input columns [{cols.start}, {cols.stop})", case)
        check_grad(out, pn, dwp[:, cols], "the proj weight shard", case, W)
        ppn = find_param(out["params"], bp, "the full proj bias", case)
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


# ----------------------------------------------------------------------------- Part C

def check_one_all_reduce_each_way(res, W, n, what):
    for r, out in enumerate(res):
        fwd, bwd = collectives(out["events"])
        case = f"{what}, W={W}, rank {r}"
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


@pytest.mark.part("C")
@pytest.mark.points(2)
@pytest.mark.parametrize("kind, W", [("mlp", 2), ("mlp", 4), ("attention", 2)], ids=["mlp-W2", "mlp-W4", "attn-W2"])
def test_parameters_hold_one_wth_in_storages_of_their_own(kind, W, impl, seed):
    d, hidden = 32, 64
    if kind == "mlp":
        layers = [linear_weights(seed, d, hidden, salt=6), linear_weights(seed, hidden, d, salt=7)]
        build, kw = "ParallelMLP.from_mlp", {}
    else:
        layers = [linear_weights(seed, d, 3 * d, salt=8), linear_weights(seed, d, d, salt=9)]
        build, kw = "ParallelAttention.from_attention", {"n_heads": 4}
    x = torch.randn(1, 2, d, generator=gen(seed, "xs"))
    res = run(impl, W, body_step, build, layers, x, torch.ones(1, 2, d), kw)
    want = expected_bytes(kind, W, d, hidden)
    for r, out in enumerate(res):
        case = f"{build.split('.')[0]}, W={W}, rank {r}"
        held = sum(p.numel() * p.element_size() for p in out["params"].values())
        assert held == want, f"{case}: the parameters hold {held} bytes, expected {want} (1/W of each sharded weight " \
                             "and column-parallel bias, plus the full row-parallel bias)"
        assert out["reachable"] <= want + 4096, (
            f"{case}: {out['reachable']} bytes of tensor storage are reachable from the module, the shards are {want} "
            f"(largest: {out['largest']}): keep copies of the shards (.clone(), not views of the full weight) and no "
            "reference to the original layers")
