"""Shared helpers for visible tests and hidden graders: inputs, assertions, rules.

Graders import these instead of copying them (design.md, "Dependency rules").
Messages follow the grader style: the bug class first, then the smallest
failing case, then a few elements.
"""
from __future__ import annotations

import ast
import contextlib
from typing import Iterable, Sequence

import pytest
import torch

from .sandbox.calls import measure

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


def devices() -> list:
    """Params for a ``device`` argument: cpu everywhere, cuda with the ``gpu`` mark."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def tolerance(dtype: torch.dtype, device: str, grad: bool = False) -> tuple[float, float]:
    """(atol, rtol) of the contract: float32 1e-5 on CPU, 2e-3 on CUDA (TF32; 1e-2
    for gradients); float16 and bfloat16 from their rounding (2^-10, 2^-7 ulps)."""
    if dtype == torch.float64:
        return 1e-10, 1e-10
    if dtype == torch.float32:
        if str(device).startswith("cuda"):
            return (1e-2, 1e-2) if grad else (2e-3, 2e-3)
        return (1e-4, 1e-4) if grad else (1e-5, 1e-5)
    if dtype == torch.float16:
        return (2e-2, 2e-2) if grad else (5e-3, 5e-3)
    if dtype == torch.bfloat16:
        return (6e-2, 6e-2) if grad else (3e-2, 3e-2)
    raise TypeError(f"no tolerance for dtype {dtype}")


def randn(shape: Sequence[int], gen: torch.Generator, *, dtype=torch.float32, device="cpu",
          layout: str = "contiguous", scale: float = 1.0) -> torch.Tensor:
    """Standard normal values (drawn on CPU from ``gen``, so identical on every device)
    in one of three layouts holding the same values: ``contiguous``; ``strided``
    (a view taking every other element of the last dim of a wider buffer);
    ``transposed`` (the last two dims stored swapped). Raises ValueError for
    another layout."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale
    if layout == "contiguous":
        out = x.to(dtype)
    elif layout == "strided":
        wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
        wide[..., ::2] = x.to(dtype)
        out = wide[..., ::2]
    elif layout == "transposed":
        out = x.to(dtype).transpose(-1, -2).contiguous().transpose(-1, -2)
    else:
        raise ValueError(f"layout must be contiguous, strided or transposed, got {layout!r}")
    if device != "cpu":
        # move the underlying buffer, keeping the layout
        base = out if out._base is None else out._base
        moved = base.to(device)
        out = moved.as_strided(out.shape, out.stride(), out.storage_offset())
    return out


def _fmt_index(flat: int, shape) -> tuple:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape)))


def assert_close(actual, expected: torch.Tensor, *, atol: float, rtol: float, what: str,
                 case: str = "", equal_nan: bool = False, max_show: int = 3) -> None:
    """Compare ``actual`` to ``expected`` (any dtypes; compared in float64).

    Raises AssertionError naming ``what`` and ``case``: wrong type, shape, NaN
    or Inf where the reference is finite, a finite value where it is NaN, and otherwise the number of elements
    outside ``atol + rtol * |expected|`` with the worst few (index, got, want).
    ``-inf``/``inf`` must match exactly where the reference has them."""
    where = f" ({case})" if case else ""
    if type(actual) is not torch.Tensor:
        raise AssertionError(f"{what}{where}: expected a torch.Tensor, got {type(actual).__name__}")
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}{where}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    nan = torch.isnan(a) & ~(torch.isnan(e) if equal_nan else torch.zeros_like(a, dtype=torch.bool))
    if nan.any():
        idx = [_fmt_index(i, a.shape) for i in nan.flatten().nonzero()[:max_show, 0].tolist()]
        raise AssertionError(f"{what}{where}: NaN at {int(nan.sum())} element(s), first at {idx}")
    missing = torch.isnan(e) & ~torch.isnan(a)  # a NaN the reference has must be there (NaN - x compares False)
    if missing.any():
        idx = [_fmt_index(i, a.shape) for i in missing.flatten().nonzero()[:max_show, 0].tolist()]
        raise AssertionError(f"{what}{where}: expected NaN at {int(missing.sum())} element(s), got finite values, "
                             f"first at {idx}")
    inf_e, inf_a = torch.isinf(e), torch.isinf(a)
    inf_bad = (inf_e | inf_a) & ~((inf_e & inf_a) & (torch.sign(a) == torch.sign(e)))
    if inf_bad.any():
        i = int(inf_bad.flatten().nonzero()[0, 0])
        raise AssertionError(f"{what}{where}: infinity mismatch at {int(inf_bad.sum())} element(s), first at "
                             f"{_fmt_index(i, a.shape)}: got {a.flatten()[i].item()}, expected {e.flatten()[i].item()}")
    finite = ~inf_e
    err = torch.where(finite, (a - e).abs(), torch.zeros_like(a))
    bad = err > atol + rtol * e.abs().where(finite, torch.zeros_like(e))
    if bad.any():
        worst = torch.argsort(err.flatten(), descending=True)[:max_show].tolist()
        shown = ", ".join(f"{_fmt_index(i, a.shape)}: got {a.flatten()[i].item():.6g}, "
                          f"want {e.flatten()[i].item():.6g}" for i in worst)
        raise AssertionError(f"{what}{where}: {int(bad.sum())} of {a.numel()} elements differ beyond "
                             f"atol={atol:g}, rtol={rtol:g} (max abs error {err.max().item():.3g}); {shown}")


def checked(value, oracle, *, atol: float = 0.0, rtol: float = 0.0, what: str = "output", case: str = "",
            prop: str = "the property"):
    """Assert that ``value`` is right before a property of it is graded; return ``value``.

    A property (determinism, shapes, dtypes, layout, memory, storage, communication,
    FLOPs) counts only when the values are right: zeros of the right shape are
    deterministic, allocate nothing and cost no FLOPs. A grader passes every result
    whose property it grades through this first, so the value error is the one
    reported: ``checked(out, ref, atol=.., rtol=.., what=.., case=.., prop="the memory
    bound")``, then the property check.

    ``oracle``: the expected tensor (compared by :func:`assert_close`); a tuple or list
    of tensors for a tuple or list ``value`` of that length (``what`` may then be a
    tuple of names, one per element); or a callable ``oracle(value)`` that raises
    AssertionError when the value is wrong (a lab's own check, one that names the bug
    class). ``prop`` names the property graded after it, in the message."""
    try:
        if callable(oracle) and not isinstance(oracle, torch.Tensor):
            oracle(value)
        elif isinstance(oracle, (tuple, list)):
            names = what if isinstance(what, (tuple, list)) else [f"{what}[{i}]" for i in range(len(oracle))]
            if not isinstance(value, (tuple, list)) or len(value) != len(oracle):
                where = f" ({case})" if case else ""
                n = f" of {len(value)}" if isinstance(value, (tuple, list)) else ""
                label = " / ".join(names)
                raise AssertionError(f"{label}{where}: expected a tuple of {len(oracle)} values, got "
                                     f"{type(value).__name__}{n}")
            for got, want, name in zip(value, oracle, names):
                assert_close(got, want, atol=atol, rtol=rtol, what=name, case=case)
        else:
            assert_close(value, oracle, atol=atol, rtol=rtol, what=what, case=case)
    except AssertionError as e:
        raise AssertionError(f"{e}; {prop} counts only when the values are right") from None
    return value


def expect_raises(exc, case: str, fn, /, *args, **kwargs) -> BaseException:
    """``fn(*args, **kwargs)`` must raise ``exc`` (a class or a tuple); returns the exception.
    Otherwise AssertionError naming ``case`` (what was called and why the contract refuses it)
    and the error expected: "nothing was raised", or the other exception. The harness's own
    errors (a crashed worker) pass through."""
    names = " or ".join(e.__name__ for e in (exc if isinstance(exc, tuple) else (exc,)))
    try:
        fn(*args, **kwargs)
    except exc as e:
        return e
    except Exception as e:
        if type(e).__module__.startswith("harness."):
            raise
        raise AssertionError(f"{case}: expected {names}, got {type(e).__name__}: {str(e)[:300]}") from None
    raise AssertionError(f"{case}: expected {names}, nothing was raised")


def measure_checked(fn, *args, oracle, atol: float = 0.0, rtol: float = 0.0, what: str = "output",
                    case: str = "", prop: str = "the measured property", **kwargs):
    """``harness.sandbox.calls.measure(fn, *args, **kwargs)`` whose output is :func:`checked`
    against ``oracle`` before the caller reads the Measurement. Returns ``(out,
    Measurement)``; raises the value error first. ``kwargs`` go to ``measure`` (its
    options, then ``fn``'s keyword arguments); ``oracle``, ``atol``, ``rtol``, ``what``,
    ``case`` and ``prop`` are this function's own and cannot be passed through to ``fn``."""

    out, m = measure(fn, *args, **kwargs)
    checked(out, oracle, atol=atol, rtol=rtol, what=what, case=case, prop=prop)
    return out, m


def call_id(**kw) -> str:
    """Readable test id: ``call_id(B=2, H=3, Lq=1, dtype="fp16")`` -> ``B2-H3-Lq1-fp16``."""
    return "-".join(f"{k}{v}" if k != "dtype" else str(v) for k, v in kw.items())


MiB = 1 << 20
START_SLACK_BYTES = 96 * MiB  # torch's lazy set-up, the submission's import, the handles a test keeps


def assert_memory(m, *, peak_bytes: int, largest_numel: int, what: str, case: str = "", hint: str = "") -> None:
    """Grade one measured call's memory (``m``: a ``harness.sandbox.calls.Measurement``).

    Under the sandbox the grade follows the outside figure: the worker's peak resident
    memory during the call minus its resident memory just before (``m.peak_growth_bytes``,
    read from /proc by the trusted side, bytes; it includes the request's own inputs),
    which must not exceed ``peak_bytes``. What the submission could blind (the largest
    tensor the in-process tracker saw) is shown as a diagnostic. In-process (no outside
    figure), the in-process largest allocation must not exceed ``largest_numel`` elements.
    Graders pick shapes where the forbidden temporary is several times ``peak_bytes``
    (allocator noise is a few MiB). Raises AssertionError naming ``what``, ``case``, both
    figures and ``hint`` (what to change)."""
    where = f" ({case})" if case else ""
    inside = f"the largest tensor the in-process tracker saw was {m.largest or 'none'} ({m.max_numel} elements)"
    if m.peak_growth_bytes is not None:
        if m.peak_growth_bytes > peak_bytes:
            raise AssertionError(f"{what}{where}: the process's resident memory grew by "
                                 f"{m.peak_growth_bytes / MiB:.1f} MiB during the call (read from /proc, outside "
                                 f"the process); the bound is {peak_bytes / MiB:.1f} MiB; {inside}. {hint}".rstrip())
        over = m.peak_over_start_bytes
        if over is not None and over > peak_bytes + START_SLACK_BYTES:
            raise AssertionError(f"{what}{where}: at its peak the process held {over / MiB:.1f} MiB more than "
                                 f"before the submission was imported (read from /proc); the bound is "
                                 f"{(peak_bytes + START_SLACK_BYTES) / MiB:.0f} MiB (memory kept between calls, "
                                 f"e.g. a buffer made at import, counts); {inside}. {hint}".rstrip())
    elif m.max_numel > largest_numel:
        raise AssertionError(f"{what}{where}: {inside}; the bound is {largest_numel} elements. {hint}".rstrip())


def imported_names(source: str) -> set[str]:
    """The dotted names a module's ``source`` text reaches: what it imports (``import a.b``,
    ``from a import b`` gives ``a`` and ``a.b``), every bare name, every attribute chain on a
    name (``torch.utils.checkpoint``) and every ``__import__("...")`` string. For a grader's
    "must not use X" check on the submitted file; names built at run time from strings escape
    it (graders patch the forbidden callables too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            parts = []
            while isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name):
                names.add(".".join([node.id] + parts[::-1]))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__" and node.args \
                and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value))
    return names


def assert_storage_unchanged(before: list, after: list, bug: str, case: str) -> None:
    """The storage bytes ``after`` a refused call equal those ``before`` (lists of uint8 tensors,
    one per storage, as ``harness.sandbox.calls.held_bytes`` reads them). Raises AssertionError
    naming ``bug``, ``case`` and the storages that changed."""
    changed = [f"storage {i}: {int((a != b).sum())} of {a.numel()} bytes changed"
               for i, (a, b) in enumerate(zip(before, after)) if not torch.equal(a, b)]
    if len(before) != len(after):
        changed.append(f"{len(before)} storage(s) before, {len(after)} after")
    assert not changed, f"{bug} ({case}): " + "; ".join(changed[:3])


@contextlib.contextmanager
def one_thread(impl):
    """torch's intra-op threads at 1 in this process (the oracle) and in the implementation's
    (through the module's own ``torch``) for the block, restored after: on a loaded 2-core
    machine a second OpenMP thread made tiny float64 models ~30x slower (labs 13 and 14). A
    module whose ``torch`` is not torch, or a worker that died meanwhile, is left alone."""
    sides = [torch]
    try:
        sides.append(impl.torch)
    except AttributeError:
        pass
    before = []
    for t in sides:
        try:
            before.append(int(t.get_num_threads()))
            t.set_num_threads(1)
        except Exception:  # noqa: BLE001 - a module whose torch is not torch: its own business
            before.append(None)
    try:
        yield
    finally:
        for t, n in zip(sides, before):
            if n is not None:
                with contextlib.suppress(Exception):  # a worker that died took the setting with it
                    t.set_num_threads(n)
