"""Lab 12: training memory, activation checkpointing and mixed precision.

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

Do not use torch.utils.checkpoint: the graders make it raise (building it is the lab).
"""
from __future__ import annotations

import math

import torch

AMP_DTYPES = (torch.float16, torch.bfloat16)  # the dtypes train_step accepts


# --- Part A: a checkpoint autograd Function ---

def checkpoint(fn, *args):
    """``fn(*args)`` (one tensor) through your own ``torch.autograd.Function`` that keeps only
    the tensor arguments and recomputes ``fn`` in backward (Chen et al., 2016).

    ``args``: tensors of any dtype and device (requiring grad or not) and non-tensor values
    (floats, strings, None, ...), passed to ``fn`` unchanged, in order.
    Forward: run ``fn`` without recording a graph (``torch.no_grad()``); keep the tensor
    arguments with ``ctx.save_for_backward`` and nothing else tensor-valued (no output, no
    intermediate as a ``ctx`` attribute); remember the CPU RNG state (``torch.get_rng_state()``;
    CUDA's with ``torch.cuda.get_rng_state`` only when ``torch.cuda.is_initialized()``) and the
    autocast state (``torch.is_autocast_enabled(d)``, ``torch.get_autocast_dtype(d)`` per
    device type ``d``).
    Backward: fresh leaves ``t.detach().requires_grad_(t.requires_grad)``; inside
    ``torch.random.fork_rng(devices=...)`` set the forward's RNG state, then under
    ``torch.enable_grad()`` and the forward's autocast state (whatever is active now) rerun
    ``fn`` and ``torch.autograd.backward`` through it; return the leaves' ``.grad`` (None for
    non-tensors and tensors that do not require grad).
    Pass an extra empty tensor that requires grad through ``apply`` so that the output requires
    grad even when no argument does (a data batch: only ``fn``'s parameters learn).
    Returns ``fn(*args)``; its ``grad_fn`` is your Function's node. Must not call
    ``torch.utils.checkpoint``; without CUDA it must not touch ``torch.cuda``.
    """
    raise NotImplementedError("Part A: a custom autograd.Function: forward under no_grad saving the tensor args, "
                              "RNG and autocast state; backward reruns fn in fork_rng and backpropagates")


# --- Part B: checkpoint_sequential ---

def checkpoint_sequential(blocks, segments: int, x: torch.Tensor) -> torch.Tensor:
    """Apply ``blocks`` (a sequence of n modules or callables, each keeping x's shape) to ``x``
    in ``segments`` segments: segment i holds blocks ``[i*n//segments, (i+1)*n//segments)``
    (not torch's ``n//segments`` each with the remainder in the last);
    every segment but the last runs through :func:`checkpoint` (only its input is kept), the
    last runs plainly (backward needs its activations at once).
    Forward calls each block once; backward recomputes each block outside the last segment once.
    Saved bytes (``saved_tensors_hooks``, each storage once, parameters excluded): at most
    ``segments * x.nbytes`` plus what a plain run of the last segment saves.
    Raises TypeError when ``segments`` is not an int, ValueError when it is outside
    ``[1, len(blocks)]``."""
    raise NotImplementedError("Part B: check segments, split the blocks, checkpoint every segment but the last")


# --- Part C: dynamic loss scaling and the AMP train step ---

class DynamicLossScaler:
    """Dynamic loss scaling (Micikevicius et al., 2018): the same step decisions, scales and
    parameters as ``torch.amp.GradScaler(device, same arguments)``.

    ``init_scale`` (> 0, finite), ``growth_factor`` (> 1), ``backoff_factor`` (in (0, 1)),
    ``growth_interval`` (>= 1); anything else raises ValueError. ``scale_value`` is the current
    scale, a Python float (an attribute or a property). Per iteration:
    ``scale(loss).backward()``, optionally ``unscale_(optimizer)``, ``step(optimizer)``,
    ``update()``."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        raise NotImplementedError("Part C: validate the arguments, keep the scale (a float) and the step count")

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale_value`` (differentiable: ``.backward()`` on it gives scaled gradients)."""
        raise NotImplementedError("Part C: multiply the loss by the current scale")

    def unscale_(self, optimizer) -> None:
        """Divide every non-None ``.grad`` of ``optimizer.param_groups`` by the scale, in place,
        and record whether any holds inf/NaN. A second call before ``update()`` raises
        RuntimeError."""
        raise NotImplementedError("Part C: divide the gradients by the scale once per iteration, look for inf/NaN")

    def step(self, optimizer) -> bool:
        """Unscale first if ``unscale_`` was not called this iteration; then ``optimizer.step()``
        unless an inf/NaN gradient was found (a skipped step changes neither the parameters nor
        the optimizer state). Returns True iff the optimizer stepped."""
        raise NotImplementedError("Part C: unscale if needed, step only when every gradient is finite")

    def update(self) -> None:
        """Once per iteration, after ``step``: after a skipped step multiply the scale by
        ``backoff_factor`` and restart the count of clean steps; after ``growth_interval`` clean
        steps in a row multiply it by ``growth_factor`` (and restart the count). No floor: the
        scale may go below 1."""
        raise NotImplementedError("Part C: back off after an overflow, grow after growth_interval clean steps")


def train_step(model, batch, loss_fn, optimizer, scaler, dtype=torch.float16) -> torch.Tensor:
    """One iteration of PyTorch's AMP recipe (Micikevicius et al., 2018).

    ``inputs, targets = batch``; ``optimizer.zero_grad(set_to_none=True)``; under
    ``torch.autocast(device_type=<the parameters' device type>, dtype=dtype)``:
    ``loss = loss_fn(model(inputs), targets)``; outside it: ``scaler.scale(loss).backward()``,
    ``scaler.step(optimizer)``, ``scaler.update()``. ``scaler`` is any object with that
    interface (yours, or the graders' wrapper of ``torch.amp.GradScaler``). The parameters stay
    float32 (master weights); on overflow they and the optimizer state are unchanged and the
    scale backs off. Returns the unscaled loss (the forward's ``loss``, not the scaled loss
    divided by the scale read after ``update()``), detached, a 0-dim float32 tensor.
    Raises TypeError unless ``dtype`` is ``torch.float16`` or ``torch.bfloat16``."""
    raise NotImplementedError("Part C: zero_grad, forward under autocast, scaled backward, scaler step and update")
