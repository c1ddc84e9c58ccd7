"""Guards: a measurement cannot be switched off or replaced unseen during a measured call."""
from __future__ import annotations

import contextlib
import os

import torch

from harness.alloc import AllocationTracker

from .comm import _INSTALLED


# --- guards: a measurement cannot be switched off or replaced unseen -------------------------
#
# The in-process figures (allocation tracker, FLOP counter, op list, forbidden calls) come from
# TorchDispatchModes and patched names in the submission's own process. To hide work from a mode
# a submission must take it off the dispatch stack or exclude the Python dispatch key; to fake a
# figure it must replace a method of the tracker or counter. Both go through the torch._C bindings
# and classes below, which install_guards() replaces by recording stand-ins before the submission
# is imported (so a reference it saves is already the stand-in). A measured call during which one
# was called, or after which one is no longer in place, fails: no honest lab solution needs them.
# (What the trusted side grades on still comes from outside where it can: resident memory, CPU time.)

_BLINDING = ("_pop_torch_dispatch_stack", "_unset_dispatch_mode", "_DisableTorchDispatch", "_ExcludeDispatchKeyGuard",
             "ExcludeDispatchKeyGuard", "_SetExcludeDispatchKeyGuard", "_dispatch_tls_set_dispatch_key_excluded")
_GUARD = {"depth": 0, "calls": [], "pushed": 0, "trusted": 0}  # depth > 0: a measured call runs; pushed: modes it
# pushed; trusted > 0: trusted code runs inside it (the probes' own models), whose calls are not the submission's
# autograd's saved-tensor hook stack: a hook pair a submission pushes inside a measured call takes what autograd saves
# away from the grader's own pair (a checkpoint saving everything, GPipe passing as 1F1B)
_SAVED_HOOKS = ("_push_saved_tensors_default_hooks", "_pop_saved_tensors_default_hooks")
# nn.Module's global hooks run on every module, the grader's trusted ones included: none may be registered
_GLOBAL_HOOKS = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_pre_hooks",
                 "_global_forward_hooks", "_global_forward_hooks_always_called", "_global_module_registration_hooks",
                 "_global_parameter_registration_hooks", "_global_buffer_registration_hooks")
_IN_PLACE: list = []  # (owner, attribute, object): what must still be there when a measured call ends


def _recording(name: str, original):
    # a mode may push itself again and pop (FlopCounterMode decomposes ops inside ``with self``):
    # a pop that balances a push made during the call is not recorded, any other pop is
    pop = name.endswith("_pop_torch_dispatch_stack")

    def standin(*a, **k):
        if _GUARD["depth"] and not _GUARD["trusted"]:
            if pop and _GUARD["pushed"] > 0:
                _GUARD["pushed"] -= 1
            elif len(_GUARD["calls"]) < 10:
                _GUARD["calls"].append(name)
        return original(*a, **k)
    standin.__name__ = getattr(original, "__name__", name)
    return standin


def _pushing(original):
    def standin(*a, **k):
        if _GUARD["depth"]:
            _GUARD["pushed"] += 1
        return original(*a, **k)
    standin.__name__ = getattr(original, "__name__", "push")
    return standin


def install_guards() -> None:
    """Replace the dispatch-stack bindings of ``_BLINDING`` (in ``torch._C`` and wherever a
    loaded torch module bound them by name) and the ways to start a thread or a process
    (whose work no mode of this thread sees) by recording stand-ins, and note the methods
    of the tracker, the FLOP counter and the comm stand-ins that must stay in place. The server
    calls this before the submission is imported; idempotent."""
    if _IN_PLACE:
        return
    import sys

    from torch.utils.flop_counter import FlopCounterMode
    from torch.utils._python_dispatch import TorchDispatchMode

    torch_modules = [m for n, m in list(sys.modules.items()) if n == "torch" or n.startswith("torch.")]
    for name in _BLINDING + ("_push_on_torch_dispatch_stack",):
        original = getattr(torch._C, name, None)
        if original is None:
            continue
        standin = _pushing(original) if name == "_push_on_torch_dispatch_stack" else \
            _recording(f"torch._C.{name}", original)
        for mod in [torch._C] + torch_modules:
            for attr, value in list(getattr(mod, "__dict__", {}).items()):
                if value is original:
                    setattr(mod, attr, standin)
                    _IN_PLACE.append((mod, attr, standin))
    autograd_c = torch._C._autograd
    for name in _SAVED_HOOKS:
        original = getattr(autograd_c, name, None)
        if original is None:
            continue
        standin = _recording(f"torch._C._autograd.{name}", original)
        for mod in [autograd_c] + torch_modules:
            for attr, value in list(getattr(mod, "__dict__", {}).items()):
                if value is original:
                    setattr(mod, attr, standin)
                    _IN_PLACE.append((mod, attr, standin))
    import _thread
    import threading
    # the dispatch mode stack is per thread: a thread or a forked copy started by the call runs unmeasured
    # (a subprocess is not guarded: Triton runs its compiler as one on the first launch of a kernel)
    for owner, attr in ((_thread, "start_new_thread"), (threading, "_start_new_thread"),
                        (_thread, "start_joinable_thread"), (threading, "_start_joinable_thread"),
                        (os, "fork"), (os, "forkpty")):
        original = getattr(owner, attr, None)
        if original is not None:
            standin = _recording(f"{owner.__name__}.{attr}", original)
            setattr(owner, attr, standin)
            _IN_PLACE.append((owner, attr, standin))
    for cls in (AllocationTracker, FlopCounterMode, TorchDispatchMode):
        for attr, value in list(vars(cls).items()):
            if callable(value) or isinstance(value, (classmethod, staticmethod)):
                _IN_PLACE.append((cls, attr, value))
    _IN_PLACE.extend((owner, attr, new) for owner, attr, _, new in _INSTALLED)


def _tampered() -> list[str]:
    import torch.nn.modules.module as nn_module
    from torch.utils.module_tracker import ModuleTracker  # FlopCounterMode's own hooks: trusted
    hooks = [f"torch.nn.modules.module.{h} (a global module hook)" for h in _GLOBAL_HOOKS
             if any(not isinstance(getattr(f, "__self__", None), ModuleTracker)
                    for f in (getattr(nn_module, h, None) or {}).values())]
    return hooks + [f"{getattr(o, '__name__', o)}.{a}" for o, a, v in _IN_PLACE
                    if (vars(o).get(a) if isinstance(o, type) else getattr(o, a, None)) is not v][:5]


@contextlib.contextmanager
def trusted():
    """Around trusted code the probes run inside a submission's measured call (the grader's own
    models): what it calls is not recorded against the submission."""
    _GUARD["trusted"] += 1
    try:
        yield
    finally:
        _GUARD["trusted"] -= 1


@contextlib.contextmanager
def guarded():
    """Around a submission's measured call: raise AssertionError afterwards if the call
    switched a measurement off (called a ``_BLINDING`` binding, pushed or popped autograd's
    saved-tensor hooks, started a thread or a process), replaced part of one, or a global
    module hook is registered."""
    install_guards()
    _GUARD["depth"] += 1
    if _GUARD["depth"] == 1:
        _GUARD["calls"], _GUARD["pushed"] = [], 0
    try:
        yield
    finally:
        _GUARD["depth"] -= 1
    problems = sorted(set(_GUARD["calls"])) + _tampered()
    if problems and _GUARD["depth"] == 0:
        raise AssertionError(f"the measurement was switched off or replaced during the call ({', '.join(problems)}); "
                             "the lab's code must run under the grader's measurements (no torch dispatch-stack "
                             "manipulation, no saved-tensor or global module hooks, no patching of the harness)")
