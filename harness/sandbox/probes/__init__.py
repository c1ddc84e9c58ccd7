"""Probes: every measurement of student code, written once, run where the object lives.

A probe is a function ``probe_<name>(module, **values) -> (value, figures)`` in one of this
package's family modules: ``module`` is the implementation module (whose globals
``common.forbid`` also patches), ``values`` are live objects (decoded tensors, handles
resolved to the objects they name), ``value`` goes back by value (or as handles),
``figures`` is plain JSON. ``PROBES`` below is the one registry: every ``probe_*``
function of every module of this package, by name. A new lab family adds its probes
in one new module here; nothing else on the worker side changes.

Families: ``common`` (clocks bound before the submission, tree helpers, forbidden
names), ``comm`` (the communication counter), ``guards`` (a measurement cannot be
switched off), ``measure`` (one call measured: allocations, ops, FLOPs, forbidden
calls, communication; ``vjp``), ``objects`` (what an object holds or reaches),
``groups`` (process groups of the ranks), ``training`` (the data-parallel labs'
trusted model and steps), ``recompute`` (activation checkpointing and loss scaling),
``timing`` (candidate and baseline interleaved), ``speculative`` (lab 14: the graders' table
models, their call logs kept in the probe module, never on an object the submission holds).

Under ``--sandbox worker`` (``labs grade``) the worker's request loop
(``harness.sandbox.server``) runs them next to the submission, in the sandbox; in a
local run (``--sandbox none``) ``harness.sandbox.calls`` calls the same functions
in-process. Graders never call this package: they use the trusted side's functions
(``measure``, ``vjp``, ``timed``, ...), which dispatch here.

What a probe reports about a submission's own objects comes from the process the
submission runs in, so the trusted side treats figures as claims: it recomputes values
itself, and cross-checks figures from outside (``harness.sandbox.outside``) where the
contract grades them. Every family module is imported with this package, before the
submission, so the names each binds at import (trusted baselines, clocks) are the
originals.
"""
from __future__ import annotations

import importlib
import pkgutil

from .common import preload  # noqa: F401  (the server's: before the submission is imported)

FAMILIES = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]


def _registry() -> dict:
    out: dict = {}
    for mod in FAMILIES:
        for name, fn in vars(mod).items():
            if name.startswith("probe_") and callable(fn) and getattr(fn, "__module__", None) == mod.__name__:
                key = name.removeprefix("probe_")
                if key in out:
                    raise RuntimeError(f"probe {key!r} is defined in {out[key].__module__} and {mod.__name__}")
                out[key] = fn
    return out


PROBES = _registry()
"""Every probe by name: the worker's ``probe`` op runs only these."""
