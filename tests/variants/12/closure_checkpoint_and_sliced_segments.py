"""checkpoint and checkpoint_sequential decomposed another way (a full module; Part C is the reference's).
checkpoint binds fn and the non-tensor arguments into a closure before apply, so only tensors go through the Function
(ctx keeps the closure, the tensor slots and the states); the RNG and autocast states are snapshots taken by small
helpers and re-entered with a contextlib.ExitStack; backward collects the leaves' gradients with a dict by position.
checkpoint_sequential slices the list of blocks into segment lists first (the contract's bounds from divmod
arithmetic), then folds x through them.
Proves: the part A and B graders accept any correct checkpoint, whatever carries fn, its arguments and the states."""
from __future__ import annotations

import contextlib
import math

import torch

MAY_FAIL = []
SELECT = "checkpoint or sequential"


# --- Part A: a checkpoint autograd Function ---

def _autocast_state():
    """{device_type: (enabled, dtype)} for CPU, and CUDA when it is available."""
    kinds = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in kinds}


def _cuda_devices(tensors):
    """The CUDA devices whose RNG a rerun replays: the arguments' and, when CUDA is up, the current one."""
    if not torch.cuda.is_initialized():
        return sorted({t.device.index for t in tensors if t.is_cuda})
    return sorted({t.device.index for t in tensors if t.is_cuda} | {torch.cuda.current_device()})


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, anchor, *tensors):
        ctx.run = run
        ctx.save_for_backward(*tensors)
        ctx.autocast = _autocast_state()
        ctx.devices = _cuda_devices(tensors)
        ctx.rng = (torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in ctx.devices])
        with torch.no_grad():
            return run(*tensors)

    @staticmethod
    def backward(ctx, grad_out):
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        cpu_state, cuda_states = ctx.rng
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=ctx.devices))
            torch.set_rng_state(cpu_state)
            for d, s in zip(ctx.devices, cuda_states):
                torch.cuda.set_rng_state(s, d)
            stack.enter_context(torch.enable_grad())
            for d, (on, dt) in ctx.autocast.items():
                stack.enter_context(torch.autocast(d, enabled=on, dtype=dt))
            out = ctx.run(*leaves)
        if out.requires_grad:
            torch.autograd.backward(out, grad_out)
        grads = {i: leaf.grad for i, leaf in enumerate(leaves) if leaf.requires_grad}
        return (None, None, *[grads.get(i) for i in range(len(leaves))])


def checkpoint(fn, *args):
    """fn(*args) through _Recompute: the non-tensor arguments are bound into ``run`` here."""
    where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def run(*tensors):
        full = list(args)
        for i, t in zip(where, tensors):
            full[i] = t
        return fn(*full)

    anchor = torch.empty(0, requires_grad=True)
    return _Recompute.apply(run, anchor, *[args[i] for i in where])


# --- Part B: checkpoint_sequential ---

def _chain(seq):
    def run(h):
        for block in seq:
            h = block(h)
        return h
    return run


def checkpoint_sequential(blocks, segments: int, x: torch.Tensor) -> torch.Tensor:
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise TypeError(f"segments must be an int, got {type(segments).__name__} {segments!r}")
    blocks = list(blocks)
    n = len(blocks)
    if not 1 <= segments <= n:
        raise ValueError(f"segments must be in [1, len(blocks)] = [1, {n}], got {segments}")
    q, r = divmod(n, segments)
    bounds = [i * q + (i * r) // segments for i in range(segments + 1)]  # == i * n // segments
    parts = [blocks[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    for seq in parts[:-1]:
        x = checkpoint(_chain(seq), x)
    return _chain(parts[-1])(x)


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
