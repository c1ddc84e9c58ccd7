"""Shared checks for the lab 16 graders (performance modelling), given to tests as the ``num``
fixture (a conftest, so it works under ``--import-mode=importlib``).

Every function of lab 16 returns numbers, so every grader compares numbers: ``num.value``
reads one (a Python int or float; a numpy or 0-dim torch scalar through ``.item()``, which is
how it crosses the sandbox: a numpy scalar comes back as a handle), ``num.exact`` compares an
exact integer, ``num.close`` a float at a relative tolerance, and both name the bug class when
the value is one a known bug gives (``known``: ``[(bug class, the value that bug gives)]``).
``num.refused`` grades a refusal after its valid neighbour (the same entry point on a valid
input, graded on its value first): a refusal counts only beside a value that is right.

Charged once. Where a function's value is built from another graded function's (training
FLOPs from forward FLOPs, MFU from training FLOPs, a data-parallel step from the ring
all-reduce time), the graders also accept the contract's formula applied to the submission's
own upstream value (``num.own``): that upstream function's bug is graded where it lives, not
again here. ``num.own`` takes the submission's value only when it is plausible (a finite
number within a factor 4 of the right one), so a function returning 0 gains nothing.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.toolkit import expect_raises, is_remote


def _type_name(x) -> str:
    if is_remote(x):
        return repr(x).removeprefix("<sandboxed ").removesuffix(">")
    return f"{type(x).__module__}.{type(x).__qualname__}".removeprefix("builtins.")


def value(x, what: str, case: str = ""):
    """``x`` as a Python number (int or float), or AssertionError naming ``what``: a bool, a
    string, a tensor of more than one element or anything else is not a number."""
    where = f" ({case})" if case else ""
    if type(x) in (int, float):
        return x
    if isinstance(x, bool) or x is None or isinstance(x, (str, bytes, tuple, list, dict)):
        raise AssertionError(f"{what}{where}: expected a number, got {_type_name(x)} {x!r}"[:500])
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise AssertionError(f"{what}{where}: expected a number, got a tensor of shape {tuple(x.shape)}")
        return x.item()
    if isinstance(x, (int, float)):  # a numpy scalar in-process (np.float64 is a float)
        return float(x) if isinstance(x, float) else int(x)
    try:
        item = x.item()  # a numpy scalar, in-process or as a handle from the worker
    except Exception:
        item = None
    if type(item) in (int, float):
        return item
    raise AssertionError(f"{what}{where}: expected a number (int or float), got {_type_name(x)}")


def _named(bug_value_pairs, got, same):
    return next((bug for bug, wrong in bug_value_pairs if wrong is not None and same(got, wrong)), None)


def exact(x, want: int, what: str, case: str = "", known=(), hint: str = "", also=()) -> int:
    """``x`` equals the integer ``want`` (or one of ``also``, see ``own``) exactly (an int-valued
    float equal to it is fine here; the type is graded once, by the int-type test). Otherwise
    AssertionError: the known bug class the value matches, else ``what``; the case; got and want."""
    got = value(x, what, case)
    if got != want and got not in also:
        bug = _named(known, got, lambda a, b: a == b)
        where = f" ({case})" if case else ""
        raise AssertionError(f"{bug or what}{where}: got {got!r}, want {want!r}" + (f"; {hint}" if hint else ""))
    return got


def rel_close(a, b, rel: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * max(abs(a), abs(b)))


def close(x, want: float, what: str, case: str = "", rel: float = 1e-12, known=(), hint: str = "", also=()):
    """``x`` within a relative ``rel`` of ``want`` (or of one of ``also``: the contract's formula
    on the submission's own upstream values, see ``own``). Otherwise AssertionError naming the
    known bug class the value matches (within the same tolerance), else ``what``."""
    got = value(x, what, case)
    if any(rel_close(got, w, rel) for w in (want, *also)):
        return got
    bug = _named(known, got, lambda a, b: rel_close(a, b, max(rel, 1e-9)))
    where = f" ({case})" if case else ""
    raise AssertionError(f"{bug or what}{where}: got {got!r}, want {want!r}" + (f"; {hint}" if hint else ""))


def own(fn, want, *args, factor: float = 4.0, **kwargs):
    """The submission's own ``fn(*args, **kwargs)`` as a number when it is a plausible stand-in for
    ``want`` (finite, the same sign, within ``factor``), else None (it raised, or is garbage)."""
    try:
        got = value(fn(*args, **kwargs), "upstream")
    except Exception as e:
        if type(e).__module__.startswith("harness."):
            raise
        return None
    if not math.isfinite(got) or got == want:
        return None
    if want == 0 or (got > 0) != (want > 0) or not 1 / factor <= got / want <= factor:
        return None
    return got


def refused(exc, case: str, fn, /, *args, name: str | None = None, **kwargs):
    """``fn(*args, **kwargs)`` raises ``exc`` whose message names ``name`` (the offending
    argument; the contract's messages name it). AssertionError otherwise."""
    e = expect_raises(exc, case, fn, *args, **kwargs)
    if name is not None and name not in str(e):
        raise AssertionError(f"{case}: the {type(e).__name__} must name the argument {name!r}; its message was "
                             f"{str(e)[:200]!r}")
    return e


@pytest.fixture
def num():
    """The lab 16 number checks: ``value``, ``exact``, ``close``, ``own``, ``refused``, ``rel_close``."""
    return SimpleNamespace(value=value, exact=exact, close=close, own=own, refused=refused, rel_close=rel_close)
