"""Lab 12: training memory, activation checkpointing and mixed precision (reference).

You build the two standard ways to fit a bigger model or batch into the same memory:
activation checkpointing (Chen et al., 2016, "Training Deep Nets with Sublinear Memory
Cost": keep only each segment's input, recompute the rest in backward) and mixed
precision with dynamic loss scaling (Micikevicius et al., 2018, "Mixed Precision
Training": float16/bfloat16 compute under autocast, float32 master weights, a loss scale
that backs off on overflow and grows after a run of clean steps).

Parts (see README.md):
  A  checkpoint: a custom autograd.Function with RNG and autocast restore   pytest labs/12 -k checkpoint_fn
  B  checkpoint_sequential and its saved-activation bound                   pytest labs/12 -k sequential
  C  DynamicLossScaler and the AMP train_step                               pytest labs/12 -k "scaler or train_step"
Run everything with `pytest labs/12`; self-grade with `labs grade . --lab 12`.
"""
from __future__ import annotations

import math

import torch

AUTOCAST_DEVICES = ("cpu", "cuda")  # the device types whose autocast state a checkpoint restores
_TENSOR = object()  # marks a tensor argument's place among the non-tensor ones


# --- Part A: a checkpoint autograd Function ---

class _Checkpoint(torch.autograd.Function):
    """``forward(ctx, fn, anchor, *args)``: ``fn(*args)`` without a graph; ``anchor`` is an
    empty tensor that requires grad (so the output requires grad even when no argument does).
    ``ctx`` keeps the tensor arguments (``save_for_backward``), the non-tensor ones, ``fn``, the
    RNG states and the autocast state; backward reruns ``fn`` with them and backpropagates."""

    @staticmethod
    def forward(ctx, fn, anchor, *args):
        ctx.fn = fn
        ctx.slots = [_TENSOR if isinstance(a, torch.Tensor) else a for a in args]  # non-tensors, in place
        ctx.save_for_backward(*[a for a in args if isinstance(a, torch.Tensor)])
        ctx.autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICES}
        ctx.cpu_rng = torch.get_rng_state()
        # CUDA's RNG only where CUDA is already up (never initialise it here, never touch it without it)
        ctx.cuda_devices = sorted({a.device.index for a in args if isinstance(a, torch.Tensor) and a.is_cuda}
                                  | ({torch.cuda.current_device()} if torch.cuda.is_initialized() else set()))
        ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.cuda_devices]
        with torch.no_grad():
            return fn(*args)

    @staticmethod
    def backward(ctx, grad_out):
        saved = iter(ctx.saved_tensors)
        args = []
        for slot in ctx.slots:
            if slot is _TENSOR:  # a tensor argument: a fresh leaf, requiring grad as the original did
                t = next(saved)
                args.append(t.detach().requires_grad_(t.requires_grad))
            else:
                args.append(slot)
        with torch.random.fork_rng(devices=ctx.cuda_devices):
            torch.set_rng_state(ctx.cpu_rng)
            for d, state in zip(ctx.cuda_devices, ctx.cuda_rng):
                torch.cuda.set_rng_state(state, d)
            with torch.enable_grad(), _autocast_as(ctx.autocast):
                out = ctx.fn(*args)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            torch.autograd.backward(out, grad_out)
        grads = [a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None for a in args]
        return (None, None, *grads)


class _autocast_as:
    """Enter the autocast state ``{device_type: (enabled, dtype)}`` for each device type
    (CUDA's only where CUDA is available)."""

    def __init__(self, state):
        self.contexts = [torch.autocast(d, enabled=on, dtype=dt) for d, (on, dt) in state.items()
                         if d == "cpu" or (d == "cuda" and torch.cuda.is_available())]

    def __enter__(self):
        for c in self.contexts:
            c.__enter__()
        return self

    def __exit__(self, *exc):
        for c in reversed(self.contexts):
            c.__exit__(*exc)
        return False


def checkpoint(fn, *args):
    """``fn(*args)`` (one tensor) through a custom ``torch.autograd.Function`` that keeps only
    the tensor arguments and recomputes ``fn`` in backward (Chen et al., 2016).

    ``args``: tensors of any dtype and device (requiring grad or not) and non-tensor values,
    passed to ``fn`` unchanged. Forward runs ``fn`` under ``no_grad``; backward reruns it inside
    ``torch.random.fork_rng`` from the forward's CPU (and, when CUDA is initialised, CUDA) RNG
    state and under the forward's autocast state, then backpropagates through the rerun:
    gradients of the tensor arguments and of ``fn``'s parameters equal a direct call's, dropout
    masks included, and the global RNG after backward is what a direct call leaves. An extra
    empty tensor that requires grad goes through the Function, so the output requires grad even
    when no argument does (a data batch, with ``fn``'s parameters to train). Returns the output
    of ``fn``; its ``grad_fn`` is the Function's node. Does not use ``torch.utils.checkpoint``.
    """
    anchor = torch.empty(0, requires_grad=True)
    return _Checkpoint.apply(fn, anchor, *args)


# --- Part B: checkpoint_sequential ---

def _run(blocks, lo: int, hi: int):
    """A function applying ``blocks[lo:hi]`` in order."""
    def segment(h):
        for j in range(lo, hi):
            h = blocks[j](h)
        return h
    return segment


def checkpoint_sequential(blocks, segments: int, x: torch.Tensor) -> torch.Tensor:
    """Apply ``blocks`` (a sequence of n modules or callables, each keeping x's shape) to ``x``
    in ``segments`` segments: segment i holds blocks ``[i*n//segments, (i+1)*n//segments)``;
    every segment but the last runs through :func:`checkpoint` (only its input is kept), the
    last runs plainly (its activations are needed at once by backward). Saved bytes: at most
    ``segments * x.nbytes`` plus what a plain run of the last segment saves.
    Raises TypeError when ``segments`` is not an int, ValueError when it is outside
    ``[1, len(blocks)]``."""
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise TypeError(f"segments must be an int, got {type(segments).__name__} {segments!r}")
    n = len(blocks)
    if not 1 <= segments <= n:
        raise ValueError(f"segments must be in [1, len(blocks)] = [1, {n}], got {segments}")
    bounds = [i * n // segments for i in range(segments + 1)]
    for i in range(segments - 1):
        x = checkpoint(_run(blocks, bounds[i], bounds[i + 1]), x)
    return _run(blocks, bounds[-2], n)(x)


# --- Part C: dynamic loss scaling and the AMP train step ---

class DynamicLossScaler:
    """Dynamic loss scaling (Micikevicius et al., 2018), as ``torch.amp.GradScaler``.

    ``init_scale`` (> 0, finite), ``growth_factor`` (> 1), ``backoff_factor`` (in (0, 1)),
    ``growth_interval`` (>= 1); anything else raises ValueError. ``scale_value`` is the current
    scale (a Python float). Per iteration: ``scale(loss).backward()``, optionally
    ``unscale_(optimizer)``, ``step(optimizer)``, ``update()``."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        if not (isinstance(init_scale, (int, float)) and math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"init_scale must be finite and > 0, got {init_scale!r}")
        if not growth_factor > 1:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if not growth_interval >= 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval!r}")
        self.scale_value = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self._clean_steps = 0      # clean steps in a row since the last change of scale
        self._unscaled = False     # unscale_ was called this iteration
        self._found_inf = False    # ... and found an inf/NaN gradient
        self._skipped = False      # the last step() skipped the optimizer

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale_value`` (differentiable)."""
        return loss * self.scale_value

    def unscale_(self, optimizer) -> None:
        """Divide every non-None ``.grad`` of ``optimizer``'s param groups by the scale, in
        place, and record whether any holds inf/NaN. A second call before ``update()`` raises
        RuntimeError."""
        if self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(self.scale_value)
                    found = found or not bool(torch.isfinite(p.grad).all())
        self._unscaled, self._found_inf = True, found

    def step(self, optimizer) -> bool:
        """Unscale (if ``unscale_`` was not called this iteration), then ``optimizer.step()``
        unless an inf/NaN gradient was found. Returns True iff the optimizer stepped."""
        if not self._unscaled:
            self.unscale_(optimizer)
        self._skipped = self._found_inf
        if self._skipped:
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        """After a skipped step: scale *= backoff_factor and the count restarts; after
        ``growth_interval`` clean steps in a row: scale *= growth_factor."""
        if self._skipped:
            self.scale_value *= self.backoff_factor
            self._clean_steps = 0
        else:
            self._clean_steps += 1
            if self._clean_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self._clean_steps = 0
        self._unscaled = self._found_inf = self._skipped = False


AMP_DTYPES = (torch.float16, torch.bfloat16)


def train_step(model, batch, loss_fn, optimizer, scaler, dtype=torch.float16) -> torch.Tensor:
    """One iteration of PyTorch's AMP recipe.

    ``inputs, targets = batch``; ``optimizer.zero_grad(set_to_none=True)``; under
    ``torch.autocast(device_type=<the parameters' device type>, dtype=dtype)``:
    ``loss = loss_fn(model(inputs), targets)``; outside it: ``scaler.scale(loss).backward()``,
    ``scaler.step(optimizer)``, ``scaler.update()``. The parameters stay float32 (master
    weights); on overflow they and the optimizer state are unchanged and the scale backs off.
    Returns the unscaled loss, detached, 0-dim float32. ``dtype`` must be ``torch.float16`` or
    ``torch.bfloat16`` (else TypeError)."""
    if dtype not in AMP_DTYPES:
        raise TypeError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    inputs, targets = batch
    device_type = next(model.parameters()).device.type
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device_type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach().to(torch.float32)
