"""Visible tests of lab 08 (a subset of what the hidden graders check).

Each test runs W gloo ranks through run_ranks. A body drives one rank: `rk.build_linear(w, b)`
builds a torch.nn.Linear there (a handle), `rk.call(rk.impl.ColumnParallelLinear.from_linear,
lin, ...)` shards it with your code (`.out` is a handle to your module), and
`rk.backward(m, m, x, grad_output=g, input_grads=True)` runs `m(x).backward(g)` there and
returns the output (`.out`), the gradient of x (`.input_grads[0]`), the gradients of your
module's own parameters (`.grads`, name to tensor) and the ordered log of the collectives
it issued (`.events`: `{"k": "c10d", "op": "allreduce_", "numel": ...}` per collective,
`{"k": "forward_done"}` where forward ends). `rk.state(m)` is your module's state_dict.
The oracle is the unsharded torch layers in float64, on one process. Run: pytest labs/08
"""
import pytest
import torch
import torch.nn.functional as F

from harness.toolkit import expect_raises, run_ranks

TOL = dict(atol=1e-5, rtol=1e-5)


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def block(n, W, r):
    """Rank r's block of a dimension of size n."""
    return slice(r * n // W, (r + 1) * n // W)


def close(got, want, what):
    assert got is not None, f"{what}: nothing came back (None)"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    torch.testing.assert_close(got.double(), want.double(), **TOL, msg=lambda m: f"{what}\n{m}")


def close_shards(grads, want, what):
    """Every expected shard gradient (label -> tensor) is the gradient of one of the module's
    parameters (matched by shape and value, so any parameter names pass)."""
    for label, exp in want.items():
        same_shape = [n for n, g in grads.items() if g is not None and tuple(g.shape) == tuple(exp.shape)]
        assert same_shape, (f"{what}: no parameter gradient of shape {tuple(exp.shape)} (the shard of {label}); "
                            f"got {({n: None if g is None else tuple(g.shape) for n, g in grads.items()})}")
        if not any(torch.allclose(grads[n].double(), exp.double(), **TOL) for n in same_shape):
            worst = min(same_shape, key=lambda n: (grads[n].double() - exp.double()).abs().max().item())
            close(grads[worst], exp, f"{what}: the gradient of the shard of {label} (closest parameter: {worst})")


def linear64(w, b):
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(w)
        if b is not None:
            lin.bias.copy_(b)
    return lin


# --- Part A -------------------------------------------------------------------------------

def body_f_and_g(rk, xs, gs):
    r = rk.rank
    f = rk.backward(rk.impl.copy_to_tp, None, xs[0], grad_output=gs[r], input_grads=True)
    g = rk.backward(rk.impl.reduce_from_tp, None, xs[r], grad_output=gs[0], input_grads=True)
    return {"f_out": f.out, "f_grad": f.input_grads[0], "g_out": g.out, "g_grad": g.input_grads[0]}


@pytest.mark.part("A")
def test_copy_to_tp_and_reduce_from_tp(impl):
    W = 2
    xs = [rand(3, 5, seed=10 + r) for r in range(W)]
    gs = [rand(3, 5, seed=20 + r) for r in range(W)]
    res = run_ranks(body_f_and_g, W, xs, gs, impl=impl, timeout=60)
    for r in range(W):
        close(res[r]["f_out"], xs[0], f"rank {r}: copy_to_tp(x) forward must return x unchanged")
        close(res[r]["f_grad"], sum(gs), f"rank {r}: copy_to_tp backward: the gradient of x is the sum over the "
                                         "ranks of the gradients reaching it (all-reduce)")
        close(res[r]["g_out"], sum(xs), f"rank {r}: reduce_from_tp(x) forward: the sum over the ranks of their x")
        close(res[r]["g_grad"], gs[0], f"rank {r}: reduce_from_tp backward must pass the gradient unchanged")


def body_column(rk, w, b, x, g_full, gather):
    W, r = rk.world_size, rk.rank
    m = rk.call(rk.impl.ColumnParallelLinear.from_linear, rk.build_linear(w, b), gather_output=gather).out
    g = g_full if gather else g_full[..., block(w.shape[0], W, r)].contiguous()
    st = rk.backward(m, m, x, grad_output=g, input_grads=True)
    return {"state": rk.state(m), "out": st.out, "x_grad": st.input_grads[0], "grads": st.grads}


@pytest.mark.part("A")
@pytest.mark.parametrize("gather", [False, True], ids=["partitioned", "gather_output"])
def test_column_parallel_linear(impl, gather):
    W, n_in, n_out = 2, 6, 8
    w, b, x, g = rand(n_out, n_in, seed=1), rand(n_out, seed=2), rand(2, 3, n_in, seed=3), rand(2, 3, n_out, seed=4)
    res = run_ranks(body_column, W, w, b, x, g, gather, impl=impl, timeout=60)
    ref, x64 = linear64(w, b), x.double().requires_grad_(True)
    out = ref(x64)
    out.backward(g.double())
    for r in range(W):
        rows, got = block(n_out, W, r), res[r]
        close(got["state"].get("weight"), w[rows], f"rank {r}: weight must be rows [{rows.start}, {rows.stop}) of "
                                                   "the linear's weight (out/W, in)")
        close(got["state"].get("bias"), b[rows], f"rank {r}: bias must be the same rows of the linear's bias")
        want_out = out.detach() if gather else out.detach()[..., rows]
        close(got["out"], want_out, f"rank {r}: output (gather_output={gather})")
        close(got["x_grad"], x64.grad, f"rank {r}: the gradient of x (replicated: the full gradient on every rank)")
        close(got["grads"].get("weight"), ref.weight.grad[rows], f"rank {r}: the gradient of the weight shard")
        close(got["grads"].get("bias"), ref.bias.grad[rows], f"rank {r}: the gradient of the bias shard")


def body_row(rk, w, b, x, g):
    W, r = rk.world_size, rk.rank
    m = rk.call(rk.impl.RowParallelLinear.from_linear, rk.build_linear(w, b)).out
    x_part = x[..., block(w.shape[1], W, r)].contiguous()
    st = rk.backward(m, m, x_part, grad_output=g, input_grads=True)
    return {"state": rk.state(m), "out": st.out, "x_grad": st.input_grads[0], "grads": st.grads}


@pytest.mark.part("A")
def test_row_parallel_linear(impl):
    W, n_in, n_out = 2, 8, 6
    w, b, x, g = rand(n_out, n_in, seed=5), rand(n_out, seed=6), rand(2, 3, n_in, seed=7), rand(2, 3, n_out, seed=8)
    res = run_ranks(body_row, W, w, b, x, g, impl=impl, timeout=60)
    ref, x64 = linear64(w, b), x.double().requires_grad_(True)
    out = ref(x64)
    out.backward(g.double())
    for r in range(W):
        cols, got = block(n_in, W, r), res[r]
        close(got["state"].get("weight"), w[:, cols], f"rank {r}: weight must be columns [{cols.start}, "
                                                      f"{cols.stop}) of the linear's weight (out, in/W)")
        close(got["state"].get("bias"), b, f"rank {r}: bias must be the linear's full bias")
        close(got["out"], out.detach(), f"rank {r}: output (the full output on every rank; the bias added once)")
        close(got["x_grad"], x64.grad[..., cols], f"rank {r}: the gradient of x_part (this rank's block of x)")
        close(got["grads"].get("weight"), ref.weight.grad[:, cols], f"rank {r}: the gradient of the weight shard")
        close(got["grads"].get("bias"), ref.bias.grad, f"rank {r}: the gradient of the bias (the full one)")


def body_not_divisible(rk):
    # the same calls with sizes that 3 divides are accepted first: only what does not fit is refused
    rk.call(rk.impl.ColumnParallelLinear.from_linear, rk.build_linear(torch.ones(9, 4), None))
    rk.call(rk.impl.RowParallelLinear.from_linear, rk.build_linear(torch.ones(6, 9), None))
    col = expect_raises(ValueError, "ColumnParallelLinear.from_linear(nn.Linear(4, 8)) at W = 3 (8 % 3 != 0)",
                        rk.call, rk.impl.ColumnParallelLinear.from_linear, rk.build_linear(torch.ones(8, 4), None))
    row = expect_raises(ValueError, "RowParallelLinear.from_linear(nn.Linear(8, 6)) at W = 3 (8 % 3 != 0)",
                        rk.call, rk.impl.RowParallelLinear.from_linear, rk.build_linear(torch.ones(6, 8), None))
    return str(col), str(row)


@pytest.mark.part("A")
def test_sizes_not_divisible_by_W_raise(impl):
    res = run_ranks(body_not_divisible, 3, impl=impl, timeout=60)
    for r, (col, row) in enumerate(res):
        assert "out_features" in col and "8" in col, (f"rank {r}: the ValueError must name out_features and its "
                                                      f"value 8, got {col!r}")
        assert "in_features" in row and "8" in row, (f"rank {r}: the ValueError must name in_features and its "
                                                     f"value 8, got {row!r}")


# --- Parts B and C: one MLP and one attention block --------------------------------------

D_MODEL, HIDDEN, N_HEADS = 8, 16, 4


def weights():
    """The four layers' (weight, bias), scaled like nn.Linear's init (1/sqrt(in)) so float32 stays accurate."""
    d, h = D_MODEL, HIDDEN
    shapes = {"fc1": (h, d), "fc2": (d, h), "qkv": (3 * d, d), "proj": (d, d)}
    return {k: (rand(o, i, seed=30 + 2 * n) / i ** 0.5, rand(o, seed=31 + 2 * n) / i ** 0.5)
            for n, (k, (o, i)) in enumerate(shapes.items())}


def body_blocks(rk, wts, x_mlp, x_att):
    lin = {k: rk.build_linear(*v) for k, v in wts.items()}
    mlp = rk.call(rk.impl.ParallelMLP.from_mlp, lin["fc1"], lin["fc2"], c10d=True).out
    att = rk.call(rk.impl.ParallelAttention.from_attention, lin["qkv"], lin["proj"], N_HEADS, c10d=True).out
    out = {}
    for name, m, x in (("mlp", mlp, x_mlp), ("attention", att, x_att)):
        st = rk.backward(m, m, x, grad_output=torch.ones_like(x), input_grads=True)
        out[name] = {"out": st.out, "x_grad": st.input_grads[0], "grads": st.grads, "events": st.events}
    return out


def oracle_blocks(wts, x_mlp, x_att):
    """The unsharded MLP and attention in float64: outputs, input gradients and the layers."""
    d, H = D_MODEL, N_HEADS
    lin = {k: linear64(*v) for k, v in wts.items()}
    xm = x_mlp.double().requires_grad_(True)
    ym = lin["fc2"](F.gelu(lin["fc1"](xm)))
    ym.backward(torch.ones_like(ym))
    xa = x_att.double().requires_grad_(True)
    B, L, _ = xa.shape
    q, k, v = (t.view(B, L, H, d // H).transpose(1, 2) for t in lin["qkv"](xa).split(d, dim=-1))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ya = lin["proj"](o.transpose(1, 2).reshape(B, L, d))
    ya.backward(torch.ones_like(ya))
    return {"mlp": (ym.detach(), xm.grad), "attention": (ya.detach(), xa.grad)}, lin


@pytest.mark.part("B")
def test_parallel_mlp_and_attention_match_unsharded(impl):
    W, d = 2, D_MODEL
    wts, x_mlp, x_att = weights(), rand(2, 3, d, seed=40), rand(2, 5, d, seed=41)
    res = run_ranks(body_blocks, W, wts, x_mlp, x_att, impl=impl, timeout=60)
    want, lin = oracle_blocks(wts, x_mlp, x_att)
    for r in range(W):
        for name in ("mlp", "attention"):
            got = res[r][name]
            close(got["out"], want[name][0], f"rank {r}: {name} output")
            close(got["x_grad"], want[name][1], f"rank {r}: {name}: the gradient of x (the full one on every rank)")
        h_rows, d_cols = block(HIDDEN, W, r), block(d, W, r)
        qkv_rows = torch.cat([torch.arange(j * d, (j + 1) * d)[d_cols] for j in range(3)])
        close_shards(res[r]["mlp"]["grads"], {
            "fc1.weight": lin["fc1"].weight.grad[h_rows], "fc1.bias": lin["fc1"].bias.grad[h_rows],
            "fc2.weight": lin["fc2"].weight.grad[:, h_rows], "fc2.bias": lin["fc2"].bias.grad}, f"rank {r}: mlp")
        close_shards(res[r]["attention"]["grads"], {
            f"qkv.weight (rows j*d + [{d_cols.start}, {d_cols.stop}))": lin["qkv"].weight.grad[qkv_rows],
            "qkv.bias": lin["qkv"].bias.grad[qkv_rows],
            "proj.weight": lin["proj"].weight.grad[:, d_cols], "proj.bias": lin["proj"].bias.grad},
            f"rank {r}: attention")


@pytest.mark.part("C")
def test_one_all_reduce_forward_and_one_backward(impl):
    W, d = 2, D_MODEL
    x_mlp, x_att = rand(2, 3, d, seed=50), rand(2, 5, d, seed=51)
    res = run_ranks(body_blocks, W, weights(), x_mlp, x_att, impl=impl, timeout=60)
    for r in range(W):
        for name, x in (("mlp", x_mlp), ("attention", x_att)):
            events = res[r][name]["events"]
            done = next(i for i, e in enumerate(events) if e["k"] == "forward_done")
            fwd = [(e["op"], e.get("numel")) for e in events[:done] if e["k"] == "c10d"]
            bwd = [(e["op"], e.get("numel")) for e in events[done:] if e["k"] == "c10d"]
            want = [("allreduce_", x.numel())]
            assert fwd == want, (f"rank {r}: {name} forward issued {fwd}: expected exactly one all-reduce of the "
                                 f"output, B*L*d = {x.numel()} elements, and no other collective")
            assert bwd == want, (f"rank {r}: {name} backward issued {bwd}: expected exactly one all-reduce of the "
                                 f"gradient of x, B*L*d = {x.numel()} elements, and no other collective")
