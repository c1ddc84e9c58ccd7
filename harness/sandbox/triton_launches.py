"""Counting Triton kernel launches in this process (the worker side of ``measure(..., triton=True)``).

Every launch ``kernel[grid](...)`` goes through ``KernelInterface.__getitem__``, which calls
``self.run(*args, grid=grid, warmup=False, **kwargs)``: ``triton.runtime.jit.JITFunction.run``
for a compiled kernel, ``triton.runtime.interpreter.InterpretedFunction.run`` under
``TRITON_INTERPRET=1`` (an ``@triton.autotune`` or ``@triton.heuristics`` wrapper ends in the
same ``run``, once per benchmarked config too). :func:`install` wraps those two methods; a
run with ``warmup=True`` compiles without launching and is not counted. The server installs
this before the submission is imported, so a kernel decorated at import is counted.

    install()
    with counting() as c:
        flash_attention_triton(q, k, v)
    c.launches, c.kernels   # 1, {"_flash_fwd_kernel": 1}

The count is an in-process figure: a submission can blind or forge it (it runs in the same
process). It proves that a kernel ran, not what the kernel did: graders check the values, and
the ATen ops the call ran outside its kernels.

Under ``TRITON_INTERPRET=1`` :func:`install` also makes ``@triton.autotune`` use the first of
its configs without timing them: the interpreter has no GPU to time on, and Triton's
own autotuner fails there with "0 active drivers" once it has two configs to compare.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

_ACTIVE: list = []       # the open counters (nested measurements all count)
_WRAPPED: dict = {}      # class -> its original ``run``


@dataclasses.dataclass
class LaunchCounter:
    """Launches seen while :func:`counting` was open: ``launches`` in all, ``kernels`` by
    kernel name (a launch whose kernel has no name counts as ``"?"``)."""

    launches: int = 0
    kernels: dict = dataclasses.field(default_factory=dict)


def _kernel_name(fn) -> str:
    inner = getattr(fn, "fn", None)
    name = getattr(inner, "__name__", None) or getattr(fn, "__name__", None)
    return str(name)[:100] if name else "?"


def _wrap(cls) -> None:
    original = cls.__dict__.get("run")
    if original is None or cls in _WRAPPED:
        return

    def run(self, *args, grid, warmup, **kwargs):
        out = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if not warmup and _ACTIVE:
            name = _kernel_name(self)
            for c in _ACTIVE:
                c.launches += 1
                c.kernels[name] = c.kernels.get(name, 0) + 1
        return out

    _WRAPPED[cls] = original
    cls.run = run


def _first_config_when_interpreted(cls) -> None:
    """``cls.run`` (``triton.runtime.autotuner.Autotuner``) uses only its first config under the
    interpreter: with one config, ``Autotuner.run`` launches it without benchmarking (every
    Triton this course has pinned; pruning to one config is not enough on 3.7, which still
    benchmarks the pruned list)."""
    original = cls.__dict__.get("run")
    if original is None or cls in _WRAPPED:
        return

    def run(self, *args, **kwargs):
        configs = self.configs
        if not _interpreting() or len(configs) < 2:
            return original(self, *args, **kwargs)
        self.configs = configs[:1]
        try:
            return original(self, *args, **kwargs)
        finally:
            self.configs = configs

    _WRAPPED[cls] = original
    cls.run = run


def _interpreting() -> bool:
    try:
        from triton import knobs
        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET") == "1"


def install() -> bool:
    """Wrap the launch path of ``JITFunction`` and ``InterpretedFunction``, and the autotuner's
    run (idempotent). Imports Triton (about 0.25 s). Returns False where Triton is
    not installed."""
    try:
        from triton.runtime import jit
    except ImportError:
        return False
    _wrap(jit.JITFunction)
    with contextlib.suppress(ImportError):
        from triton.runtime import interpreter
        _wrap(interpreter.InterpretedFunction)
    with contextlib.suppress(ImportError):
        from triton.runtime import autotuner
        _first_config_when_interpreted(autotuner.Autotuner)
    return True


@contextlib.contextmanager
def counting():
    """A :class:`LaunchCounter` of the launches while the block runs (any thread). Counts
    nothing unless :func:`install` has run."""
    c = LaunchCounter()
    _ACTIVE.append(c)
    try:
        yield c
    finally:
        _ACTIVE.remove(c)
