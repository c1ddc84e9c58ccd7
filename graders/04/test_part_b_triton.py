"""Hidden graders, lab 04 Part B: flash_attention_triton (one Triton forward kernel).

On CPU the kernel runs under TRITON_INTERPRET=1 (set by the harness plugin), which
is slow: CPU shapes stay tiny (L <= 70) and the cases few. bfloat16 is checked on
CUDA only (the interpreter's bf16 tl.dot is wrong). The performance test is GPU
only: the kernel against SDPA's flash backend, timed interleaved in the same run.

A kernel is a kernel: every value test runs its call through ``fa.kernel_call``,
which requires at least one Triton launch during the call and no attention math
(matmul, softmax, exp) in PyTorch outside the kernel; plain PyTorch earns no Part B
point. Determinism compares calls made in two processes (``fa.check_deterministic``).
The rules (no SDPA, no block pointers) count for a call right in float32 or float16
(``fa.checked_kernel``); the block-pointer rule reads the source before anything runs.
Under the interpreter an ``@triton.autotune`` kernel runs its first config, untimed
(``harness.sandbox.triton_launches``).
"""
from __future__ import annotations

import ast
import importlib.metadata
import re

import pytest
import torch

from harness.toolkit import DTYPES, attention_flops, geomean, source, timed, tolerance

pytestmark = pytest.mark.part("B")

# (B, H, Lq, Lk, D, causal): tiny for the interpreter; lengths 1 and off block multiples
CPU_CASES = [
    (1, 1, 1, 1, 16, False),
    (1, 2, 50, 67, 32, False),     # ragged Lk over several key blocks
    (1, 2, 37, 37, 64, True),      # square causal, ragged
    (1, 1, 19, 70, 128, True),     # Lq < Lk causal (bottom-right)
    (2, 1, 70, 19, 16, True),      # Lq > Lk causal: queries 0..50 fully masked
    (1, 2, 1, 45, 32, True),       # decode: one query sees every key
]
CPU_FP16 = {(1, 2, 50, 67, 32, False), (1, 1, 19, 70, 128, True), (2, 1, 70, 19, 16, True)}
# CUDA adds lengths past the GPU tile sizes (64..128)
GPU_CASES = CPU_CASES + [
    (2, 3, 300, 300, 64, True),
    (1, 4, 129, 1000, 128, True),
    (2, 2, 777, 250, 32, True),
    (1, 2, 513, 700, 16, False),
]


def _params():
    out = []
    for c in CPU_CASES:
        for dt in ("fp32", "fp16"):
            if dt == "fp16" and c not in CPU_FP16:
                continue
            out.append(pytest.param(c, dt, "cpu", id=_cid(c, dt)))
    for c in GPU_CASES:
        for dt in ("fp32", "fp16", "bf16"):
            out.append(pytest.param(c, dt, "cuda", id=_cid(c, dt) + "-cuda", marks=pytest.mark.gpu))
    return out


def _cid(c, dt):
    B, H, Lq, Lk, D, causal = c
    return f"B{B}-H{H}-Lq{Lq}-Lk{Lk}-D{D}-{'causal' if causal else 'full'}-{dt}"


@pytest.mark.points(6)
@pytest.mark.parametrize("case,dtype,device", _params())
def test_part_b_matches_float64_attention(impl, fa, gen, case, dtype, device):
    B, H, Lq, Lk, D, causal = case
    q, k, v = fa.qkv(gen, B, H, Lq, Lk, D, dtype=DTYPES[dtype], device=device)
    cid = fa.case_id(B, H, Lq, Lk, D, causal, dtype)
    res = fa.kernel_call(impl.flash_attention_triton, q, k, v, cid, is_causal=causal)
    fa.check_forward(res, q, k, v, causal, None, cid, device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_part_b_fully_masked_rows_give_zeros_and_minus_inf(impl, fa, gen, device):
    B, H, Lq, Lk, D = 1, 2, 61, 23, 16
    q, k, v = fa.qkv(gen, B, H, Lq, Lk, D, device=device)
    cid = fa.case_id(B, H, Lq, Lk, D, True)
    fa.check_fully_masked(fa.kernel_call(impl.flash_attention_triton, q, k, v, cid, is_causal=True), q, k, v, cid, device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_part_b_stable_for_logits_near_minus_1e6(impl, fa, gen, device):
    q, k, v = fa.near_minus_1e6(gen, 1, 1, 29, 70, device=device)
    cid = "B1-H1-Lq29-Lk70-D16-full-fp32-logits~-1e6"
    fa.check_near_minus_1e6(fa.kernel_call(impl.flash_attention_triton, q, k, v, cid), q, k, v, cid)


def test_part_b_explicit_scale(impl, fa, gen):
    q, k, v = fa.qkv(gen, 1, 1, 21, 40, 32)
    cid = fa.case_id(1, 1, 21, 40, 32, True) + "-scale0.7"
    res = fa.kernel_call(impl.flash_attention_triton, q, k, v, cid, is_causal=True, scale=0.7)
    fa.check_forward(res, q, k, v, True, 0.7, cid, "cpu")


@pytest.mark.points(2)
@pytest.mark.parametrize("layouts,device", [
    (("strided", "transposed", "strided"), "cpu"),
    (("transposed", "strided", "transposed"), "cpu"),
    pytest.param(("strided", "transposed", "strided"), "cuda", marks=pytest.mark.gpu),
], ids=["qstrided-ktransposed-vstrided", "qtransposed-kstrided-vtransposed", "cuda"])
def test_part_b_noncontiguous_inputs(impl, fa, gen, layouts, device):
    B, H, Lq, Lk, D = 2, 2, 35, 45, 32
    q, k, v = fa.qkv(gen, B, H, Lq, Lk, D, layouts=layouts, device=device)
    cid = fa.case_id(B, H, Lq, Lk, D, True, layout="-".join(layouts))
    call = lambda *x: fa.kernel_call(impl.flash_attention_triton, *x, cid, is_causal=True)  # noqa: E731
    fa.check_layout(call(q, k, v), call, q, k, v, True, cid, device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_part_b_deterministic(impl, fa, gen, device):
    """Two calls on equal inputs, in two processes (see fa.check_deterministic), bitwise equal."""
    q, k, v = fa.qkv(gen, 1, 2, 40, 53, 64, dtype=torch.float16, device=device)
    other = fa.qkv(gen, 1, 2, 40, 53, 64, dtype=torch.float16, device=device)
    cid = fa.case_id(1, 2, 40, 53, 64, True, "fp16")
    fa.check_deterministic(impl, lambda *x: impl.flash_attention_triton(*x, is_causal=True), (q, k, v), other,
                           lambda res: fa.check_forward(res, q, k, v, True, None, cid, device), cid,
                           first=lambda *x: fa.kernel_call(impl.flash_attention_triton, *x, cid, is_causal=True))


def test_part_b_does_not_call_sdpa(impl, fa, gen):
    fa.checked_kernel(impl.flash_attention_triton, gen, (1, 1, 30, 30, 16, True), prop="the no-SDPA rule",
                      forbid=[fa.SDPA], reason="Part B must compute attention in its kernel")


def _block_pointer_calls(src: str) -> list[str]:
    """``"tl.make_block_ptr() (line N)"`` for each block-pointer call in ``src``: ``make_block_ptr``
    by any route (only Triton has it) and ``advance`` of ``triton.language`` (``tl.advance``,
    ``triton.language.advance``, or imported from it). Read from the syntax tree, so comments,
    strings and a helper's own ``advance`` method are not calls."""
    tree = ast.parse(src)
    tl_names, triton_names, imported = set(), set(), {}   # imported: local name -> make_block_ptr | advance
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "triton.language" and a.asname:
                    tl_names.add(a.asname)
                elif a.name.split(".")[0] == "triton":
                    triton_names.add(a.asname or "triton")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("triton"):
            for a in node.names:
                if node.module == "triton" and a.name == "language":
                    tl_names.add(a.asname or a.name)
                elif a.name in ("make_block_ptr", "advance") and node.module.startswith("triton.language"):
                    imported[a.asname or a.name] = a.name

    def is_tl(e):  # tl, or triton.language
        return (isinstance(e, ast.Name) and e.id in tl_names) or (
            isinstance(e, ast.Attribute) and e.attr == "language" and isinstance(e.value, ast.Name)
            and e.value.id in triton_names)

    found = []
    for node in ast.walk(tree):
        f = node.func if isinstance(node, ast.Call) else None
        if isinstance(f, ast.Attribute) and (f.attr == "make_block_ptr" or (f.attr == "advance" and is_tl(f.value))):
            found.append((node.lineno, f.attr))
        elif isinstance(f, ast.Name) and (f.id == "make_block_ptr" or f.id in imported):
            found.append((node.lineno, imported.get(f.id, f.id)))
    return [f"tl.{name}() (line {line})" for line, name in sorted(found)]


def _block_pointers_message(calls: list[str]) -> str:
    try:
        pinned = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pinned = "not installed"
    version = tuple(int(x) for x in re.findall(r"\d+", pinned)[:2])
    why = (f"The course's Triton ({pinned}) still runs them, deprecated; Triton 3.9 removed them"
           if version and version < (3, 9) else f"Triton 3.9 removed them (this environment: {pinned})")
    return (f"uses {', '.join(calls)}: block pointers are not allowed in this lab. {why} (NotImplementedError), "
            f"and the kernel must run on every Triton the course pins: address tiles with tl.arange offsets and "
            f"masks (or tl.make_tensor_descriptor)")


def test_part_b_uses_no_block_pointers(impl, fa, gen):
    # the source first (nothing runs): a rule about the code, whatever the kernel computes
    calls = _block_pointer_calls(source(impl))
    if calls:
        raise AssertionError(_block_pointers_message(calls))
    fa.checked_kernel(impl.flash_attention_triton, gen, (1, 1, 9, 13, 16, False), prop="the no-block-pointer rule")


def test_part_b_bad_args_raise(impl, fa, gen, bad_arg):
    """The valid neighbour runs through ``fa.kernel_call`` (a Triton launch, no attention math in
    PyTorch): refusing bad arguments earns no Part B point without a kernel."""
    name, build, exc, arg, match = bad_arg
    bad, good = build(gen)
    fa.check_refusal(impl.flash_attention_triton, bad, good, exc, arg, match, f"flash_attention_triton, {name}",
                     kernel=True)


# --- performance (GPU only) ---

# (B, H, L, D, causal): realistic training/prefill shapes, square so SDPA's causal agrees
PERF_SHAPES = [(4, 16, 1024, 64, False), (8, 16, 512, 64, True), (2, 16, 2048, 128, True)]


@pytest.mark.gpu
@pytest.mark.perf("triton_vs_sdpa_flash")
@pytest.mark.points(4)
def test_part_b_speed_vs_sdpa_flash(impl, fa, seed, lab, record_perf):
    """Geomean over shapes and fp16/bf16 of median(kernel) / median(SDPA flash), timed in
    one process next to the implementation (harness.sandbox.timed: interleaved, CUDA
    events plus a device-wide synchronize, L2 flush, fresh inputs, >= 10 repeats, outside
    cross-checks); SDPA is forbidden during the kernel's calls; every timed output is
    checked against SDPA here, and correctness (of a call that launched a Triton kernel,
    fa.kernel_call) is asserted before any timing."""
    threshold = lab.perf["triton_vs_sdpa_flash"]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ratios, figures = [], {}
    for B, H, L, D, causal in PERF_SHAPES:
        for dt in ("fp16", "bf16"):
            dtype = DTYPES[dt]
            cid = fa.case_id(B, H, L, L, D, causal, dt)

            def make(i, B=B, H=H, L=L, D=D, dtype=dtype):
                g = torch.Generator(device="cuda").manual_seed(seed + i)
                return tuple(torch.randn(B, H, L, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))

            q, k, v = make(0)
            fa.check_forward(fa.kernel_call(impl.flash_attention_triton, q, k, v, cid, is_causal=causal), q, k, v,
                             causal, None, cid, "cuda")
            atol, rtol = tolerance(dtype, "cuda")
            pool = [make(1 + i) for i in range(10)]

            def check(i, out, causal=causal, cid=cid, atol=atol, rtol=rtol, pool=pool):
                if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)):
                    raise AssertionError(f"a timed call did not return (out, lse): no performance credit ({cid})")
                want = sdpa(*pool[i], is_causal=causal)
                err = (out[0].float() - want.float()).abs()
                if torch.isnan(out[0]).any() or (err > 2 * (atol + rtol * want.float().abs())).any():
                    raise AssertionError(f"a timed output differs from SDPA (max abs error "
                                         f"{err.max().item():.3g}): no performance credit ({cid})")

            t = timed(impl.flash_attention_triton, fa.SDPA, pool, warmup_inputs=[make(11 + w) for w in range(3)],
                      check=check, kwargs={"is_causal": causal}, baseline_kwargs={"is_causal": causal},
                      forbid=[fa.SDPA, "torch._C._nn.scaled_dot_product_attention"],
                      reason="the kernel is timed against SDPA and must not call it", device="cuda",
                      backend="flash", repeats=15)
            ratios.append(t.ratio)
            flops = attention_flops(B, H, L, L, D, causal)
            figures[f"{cid}_ratio"] = t.ratio
            figures[f"{cid}_tflops"] = flops / t.candidate_s / 1e12
            figures[f"{cid}_sdpa_tflops"] = flops / t.baseline_s / 1e12
            figures[f"{cid}_outside"] = str(t.outside or t.baseline_outside)
    ratio = geomean(ratios)
    assert ratio < threshold.zero_credit, (
        f"the kernel takes {ratio:.3g}x the time of SDPA's flash backend; no performance credit at >= "
        f"{threshold.zero_credit}x, full credit at <= {threshold.full_credit}x ({figures})")
    record_perf("triton_vs_sdpa_flash", ratio, **figures)
