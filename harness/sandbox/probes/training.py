"""Training steps (data-parallel labs 07-09): a trusted model on the rank, one backward watched."""
from __future__ import annotations

import contextlib
import weakref

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard as _FULLY_SHARD  # lab 15's baseline (torch._dynamo imports it anyway)

from .comm import _ACTIVE
from .common import _gc_collect, detach_tree
from .guards import trusted
from .measure import _watched


# --- training steps (data-parallel labs): a trusted model on the rank, one backward watched ----------

_TORCH_DDP = torch.nn.parallel.DistributedDataParallel  # the lab 07 baseline, bound before any submission
_TORCH_ADAMW = torch.optim.AdamW
_saved_tensors_hooks = torch.autograd.graph.saved_tensors_hooks


class TrainNet(torch.nn.Module):
    """The model a data-parallel grader trains on each rank (trusted code, built here by
    :func:`probe_build_model` so that gradient-ready events are seen first).

    ``spec["layers"]``: a list of ``{"name", "in", "out", "bias", "dtype", "frozen"}``
    linear layers applied in order, ``tanh`` between them (``spec["ties"]``: ``[src, dst,
    attr]``: layer dst's ``attr`` is layer src's Parameter itself); ``forward(x, skip=())`` leaves
    out the layers named in ``skip`` (each of them square: unused parameters). The input
    is cast to each layer's dtype; the output is float32 times the buffer ``scale``
    (``(out,)``, broadcast at construction like every buffer). Every trainable parameter
    records a ``ready`` event (its name) in the active communication counter when its
    gradient is accumulated (``register_post_accumulate_grad_hook``, registered before
    any wrapper's hooks)."""

    def __init__(self, spec: dict):
        super().__init__()
        self.watch = bool(spec.get("watch"))
        self.layers = torch.nn.ModuleDict()
        for L in spec["layers"]:
            lin = torch.nn.Linear(int(L["in"]), int(L["out"]), bias=bool(L.get("bias", True)),
                                  dtype=getattr(torch, L.get("dtype", "float32")))
            if L.get("frozen"):
                lin.requires_grad_(False)
            self.layers[L["name"]] = lin
        self._dtypes = {L["name"]: getattr(torch, L.get("dtype", "float32")) for L in spec["layers"]}
        for src, dst, attr in spec.get("ties", []):  # one Parameter registered on two layers (lab 15)
            setattr(self.layers[dst], attr, getattr(self.layers[src], attr))
        if spec["layers"]:
            self.register_buffer("scale", torch.ones(int(spec["layers"][-1]["out"])))
        for name, p in self.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(_ready_event(name))

    def forward(self, x, skip=()):
        if not self.watch:
            return self._forward(x, skip)
        stats = _STAGE_STATS.setdefault(id(self), _stage_stats())
        call = len(stats["rows"])
        stats["rows"].append(int(x.shape[0]) if x.dim() else 0)
        stats["actions"].append(["F", call])
        with trusted():  # the grader's own hooks, inside the submission's measured call
            hooks = _saved_tensors_hooks(lambda t: _Saved(t, stats, call), _Saved.unpack)
            hooks.__enter__()
        try:
            y = self._forward(x, skip)
        finally:
            with trusted():
                hooks.__exit__(None, None, None)
        if y.requires_grad:
            y.register_hook(_backward_mark(stats, call))
        return y

    def _forward(self, x, skip):
        if not self.layers:  # a stage without parameters
            return torch.tanh(x)
        names = [n for n in self.layers if n not in skip]
        for i, n in enumerate(names):
            lin = self.layers[n]
            # a sharding wrapper may leave the attribute absent until the layer's own call (lab 15)
            x = lin(x.to(lin.weight.dtype if hasattr(lin, "weight") else self._dtypes[n]))
            if i < len(names) - 1:
                x = torch.tanh(x)
        return x.to(torch.float32) * self.scale


# Pipeline stages (``spec["watch"]``): per TrainNet, its calls (rows of each input), the order of
# forward calls and backward starts (the hook on each call's output), and how many calls hold
# saved tensors (from the first tensor autograd saves in the call until autograd frees the last).
_STAGE_STATS: dict = {}


def _stage_stats() -> dict:
    return {"rows": [], "actions": [], "live": {}, "held": 0, "peak_held": 0}


def _backward_mark(stats, call):
    def mark(grad):
        stats["actions"].append(["B", call])
    return mark


class _Saved:
    """A tensor autograd saved during one watched call; counts the call as held while alive."""

    __slots__ = ("t", "stats", "call", "__weakref__")

    def __init__(self, t, stats, call):
        self.t, self.stats, self.call = t, stats, call
        live = stats["live"]
        live[call] = live.get(call, 0) + 1
        if live[call] == 1:
            stats["held"] += 1
            stats["peak_held"] = max(stats["peak_held"], stats["held"])

    @staticmethod
    def unpack(saved):
        return saved.t

    def __del__(self):
        live = self.stats["live"]
        live[self.call] -= 1
        if not live[self.call]:
            self.stats["held"] -= 1


def probe_stage_stats(module, target, reset=False):
    """What the watched TrainNet ``target`` saw (see ``_STAGE_STATS``): ``rows``, ``actions``
    (``["F", call]``, ``["B", call]`` in order), ``peak_held``, ``held`` (now, after a collection);
    ``reset``: start afresh (before a call)."""
    if reset:
        _STAGE_STATS[id(target)] = _stage_stats()
        return None, {}
    _gc_collect()
    st = _STAGE_STATS.get(id(target), _stage_stats())
    return {k: v for k, v in st.items() if k != "live"}, {}


TORCH_FUNCTIONS = {"torch.nn.functional.mse_loss": torch.nn.functional.mse_loss,
                   "torch.nn.functional.cross_entropy": torch.nn.functional.cross_entropy,
                   "torch.nn.functional.relu": torch.nn.functional.relu,
                   "torch.nn.functional.silu": torch.nn.functional.silu,
                   "torch.optim.SGD": torch.optim.SGD, "torch.optim.AdamW": torch.optim.AdamW}


def probe_torch_function(module, dotted):
    """A handle to one of ``TORCH_FUNCTIONS`` (bound before the submission is imported), e.g.
    a loss function or an activation a grader passes to the submission, or an optimizer class a
    grader builds on the submission's parameters (lab 15: ``rk.call(handle, fsdp.parameters(), lr=...)``)."""
    if dotted not in TORCH_FUNCTIONS:
        raise ValueError(f"{dotted!r} is not one of {sorted(TORCH_FUNCTIONS)}")
    return TORCH_FUNCTIONS[dotted], {"keep": True}


def _ready_event(name: str):
    def ready(_param) -> None:
        if _ACTIVE:
            _ACTIVE[-1].event("ready", p=name)
    return ready


_MODEL_OBJECTS: dict = {}  # id(TrainNet) -> weak references to its Parameter and buffer objects as built (probe_wraps)


def seeded_state(spec: dict, seed: int) -> dict:
    """A :class:`TrainNet` state drawn from ``seed`` (one CPU generator, layers in order, float32):
    ``layers.<name>.weight`` randn(out, in) / sqrt(in), ``.bias`` randn(out) * 0.1, ``scale``
    1 + rand(out) / 4 (a spec with ties raises ValueError). The rank builds a large model
    from it (:func:`probe_build_model` with ``state=None``: nothing large crosses the wire, and one
    tensor at a time is on the CPU) and the grader's float64 oracle draws the same numbers."""
    return dict(_seeded_tensors(spec, seed))


def _seeded_tensors(spec: dict, seed: int):
    """``(name, tensor)`` of :func:`seeded_state`, drawn one at a time."""
    if spec.get("ties"):
        raise ValueError(f"seeded_state: a spec with ties ({spec['ties']}) is not drawn from a seed; send a state")
    g = torch.Generator().manual_seed(int(seed) % 2**63)
    for L in spec["layers"]:
        d_in, d_out = int(L["in"]), int(L["out"])
        yield f"layers.{L['name']}.weight", torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
        if L.get("bias", True):
            yield f"layers.{L['name']}.bias", torch.randn(d_out, generator=g) * 0.1
    yield "scale", 1 + torch.rand(int(spec["layers"][-1]["out"]), generator=g) / 4


def digest(t: torch.Tensor) -> torch.Tensor:
    """Four float64 numbers that stand for a tensor a timed step produced (so that gigabytes of
    gradients need not cross the wire): ``[sum, sum of t * cos(index), sum of |t|, sum of t**2]``
    over the flattened tensor (a ``DTensor``: its local shard), float64, shape ``(4,)``, on the CPU.
    The grader computes the same of its oracle's tensor: the signed sums agree within a fraction of
    the third, the last two within a fraction of themselves (a gradient W times too large, or one
    rank's own, changes both)."""
    t = (t.to_local() if hasattr(t, "to_local") else t).detach().reshape(-1).double()
    w = torch.arange(t.numel(), dtype=torch.float64, device=t.device).cos_()
    return torch.stack([t.sum(), (t * w).sum(), t.abs().sum(), t.square().sum()]).cpu()


def probe_build_model(module, spec, state, device="cpu"):
    """A :class:`TrainNet` from ``spec`` with ``state`` (a state dict, strict; None: the
    :func:`seeded_state` of ``spec["seed"]``) kept on this rank, on ``device`` (e.g. ``"cuda:1"``)."""
    with torch.device(device):  # built where it runs: a large model never sits whole on the CPU
        net = TrainNet(spec)
    if state is None:
        own = net.state_dict()
        with torch.no_grad():
            for name, t in _seeded_tensors(spec, spec["seed"]):
                own[name].copy_(t)
    else:
        net.load_state_dict(state, strict=True)
    # weak references: a sharding wrapper must be able to free the originals (lab 15 counts them while they live)
    _MODEL_OBJECTS[id(net)] = {"params": {n: weakref.ref(p) for n, p in net.named_parameters()},
                               "buffers": {n: weakref.ref(b) for n, b in net.named_buffers()}}
    return net, {"keep": True}


def probe_build_linear(module, weight, bias):
    """A ``torch.nn.Linear`` holding copies of ``weight (out, in)`` and ``bias (out,)`` (or
    None), kept on this rank (a layer the submission shards)."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin, {"keep": True}


def probe_wraps(module, target, model):
    """Whether the wrapper ``target`` holds ``model`` itself: ``module`` (``target.module is
    model``, a registered submodule), ``same_params`` / ``same_buffers`` (the model's own
    Parameter and buffer objects are still the model's, in place)."""
    held = getattr(target, "_modules", {}).get("module") if isinstance(target, torch.nn.Module) else None
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    built = _MODEL_OBJECTS.get(id(model), {})

    def same(refs, now):
        return all(r() is not None and r() is now.get(n) for n, r in refs.items())
    return {"module": held is model, "same_params": same(built.get("params", {}), params),
            "same_buffers": same(built.get("buffers", {}), buffers)}, {}


def probe_torch_ddp(module, target, bucket_cap_mb):
    """``torch.nn.parallel.DistributedDataParallel(target, bucket_cap_mb=...)`` on this rank
    (the trusted baseline of a data-parallel step; the class bound before the submission was
    imported), kept here."""
    return _TORCH_DDP(target, bucket_cap_mb=float(bucket_cap_mb)), {"keep": True}


def probe_step_fn(module, target, adamw=None, digests=False):
    """A training step of ``target`` (a module or a wrapper of one) as one callable, kept here
    for :func:`probe_timed`: ``step(x, grad_output)`` runs ``out = target(x)``,
    ``out.backward(grad_output)``, takes every parameter's ``.grad`` of ``target`` and returns
    ``[out, grads]``: ``out`` detached and the gradients, in ``target.parameters()`` order (None
    where none; with ``digests``, each gradient's :func:`digest`), so that a timed step is graded on
    what it computed. Then, with ``adamw`` (keyword arguments of ``torch.optim.AdamW``, built
    here on ``target.parameters()``), ``optimizer.step()`` and ``zero_grad(set_to_none=True)``;
    without, every ``.grad`` is set to None (no update: each call does the same work)."""
    opt = _TORCH_ADAMW(target.parameters(), **adamw) if adamw is not None else None

    def step(x, grad_output):
        out = target(x)
        torch.autograd.backward(out, grad_output)
        grads = [None if p.grad is None else digest(p.grad) if digests else p.grad for p in target.parameters()]
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        for p in target.parameters():
            p.grad = None
        return [out.detach(), grads]
    return step, {"keep": True}


def probe_nothing(module):
    """A callable that does nothing, kept here: the candidate :func:`probe_timed` times beside a
    trusted baseline timed alone (on clean twin ranks, ``ranks.run(clean=True)``)."""
    def nothing(*args, **kwargs):
        return None
    return nothing, {"keep": True}


def probe_fully_shard(module, target, units):
    """torch's FSDP2 on this rank (trusted code, the baseline of lab 15's step time):
    ``fully_shard(unit, reshard_after_forward=True)`` on every module of ``units`` (handles, in
    order), then on ``target``, the root, over the world group on the parameters' device type (a
    CPU model on a GPU runner stays on gloo); ``target`` itself is returned, kept here."""
    mesh = DeviceMesh.from_group(torch.distributed.group.WORLD, next(target.parameters()).device.type)
    for u in units:
        _FULLY_SHARD(u, mesh=mesh, reshard_after_forward=True)
    return _FULLY_SHARD(target, mesh=mesh, reshard_after_forward=True), {"keep": True}


def probe_state(module, target):
    """``target.state_dict()`` (parameters and buffers), detached copies."""
    return {k: v.detach().clone() for k, v in target.state_dict().items()}, {}


def probe_backward(module, target, model, args, kwargs, grad_output, opts):
    """One training step of ``target`` (e.g. a data-parallel wrapper of ``model``) under the
    communication counter: ``out = target(*args, **kwargs)``, ``out.backward(grad_output)``
    (inside ``target.no_sync()`` when ``opts["no_sync"]``), then, with ``opts["lr"]``, a plain
    SGD step on ``model``'s parameters (None: no model) and their gradients set to None. With
    ``opts["input_grads"]`` the floating tensor arguments require grad and the value also
    holds ``out`` and their ``input_grads`` (no SGD step). The counter's event
    log gets ``forward_done`` and ``backward_done`` marks. ``opts``: ``forbid`` (dotted names
    as in ``measure``), ``comm_forbid``. Value: ``{"grads", "params"}`` of ``model`` (name to
    tensor; a gradient None where it has none) after backward and after the step."""
    if opts.get("input_grads"):
        args = [a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args]
    with _watched(module, {"comm": True, "comm_forbid": opts.get("comm_forbid", ()), "forbid": opts.get("forbid", []),
                           "alloc": False, "ops": True}) as box:
        counter = _ACTIVE[-1]
        with target.no_sync() if opts.get("no_sync") else contextlib.nullcontext():
            out = target(*args, **kwargs)
            counter.event("forward_done")
            torch.autograd.backward(out, grad_output)
        counter.event("backward_done")
    named = list(model.named_parameters()) if model is not None else []
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in named}
    if opts.get("input_grads"):
        return {"grads": grads, "params": {n: p.detach().clone() for n, p in named}, "out": detach_tree(out),
                "input_grads": [a.grad.detach().clone() if isinstance(a, torch.Tensor) and a.grad is not None
                                else None for a in args]}, box
    lr = opts.get("lr")
    if lr:
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
                p.grad = None
    return {"grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}, box
