"""Recomputation and loss scaling (lab 12): trusted functions to checkpoint, scalers driven by a script."""
from __future__ import annotations

import contextlib

import torch

from .common import detach_tree, flat, forbid
from .guards import guarded
from .measure import _leaves
from .objects import reachable_tensors
from .training import TORCH_FUNCTIONS


# --- recomputation and loss scaling (activation checkpointing, mixed precision) ------------------
#
# A trusted function to checkpoint (``RecomputeNet``, built next to the code by
# ``probe_build_recompute``), one forward/backward watched end to end (``probe_recompute``:
# what autograd saved, what ``ctx`` objects keep, which calls ran in which phase, the global RNG
# before and after), a loss scaler driven through a scripted sequence of gradients
# (``probe_scaler_run``) and training steps of a trusted model (``probe_train_steps``). The
# trusted side runs the same probes in-process on torch's own ``GradScaler``
# (``GradScalerAdapter``) or a direct call for its oracle, and compares what comes back.

_RECOMPUTE_PHASE = ["idle"]  # what probe_recompute / probe_train_steps is doing (RecomputeNet logs it)
_RECOMPUTE_SEQ = [0]  # RecomputeNet calls so far, all modules together (the order of calls across modules)
_dropout = torch.nn.functional.dropout
_ACTIVATIONS = {"tanh": torch.tanh, "gelu": torch.nn.functional.gelu, "relu": torch.relu}
_saved_tensors_hooks = torch.autograd.graph.saved_tensors_hooks
_BackwardCFunction = torch.autograd.function.BackwardCFunction
_GradScaler = torch.amp.GradScaler


def _autocast_state(device_type: str) -> list:
    return [bool(torch.is_autocast_enabled(device_type)),
            str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")]


def _autocast(spec):
    """``None``: leave autocast as it is; ``"off"``: ``torch.autocast("cpu", enabled=False)``;
    ``"float16"`` / ``"bfloat16"`` (optionally ``"cuda:bfloat16"``): autocast on with that dtype."""
    if spec is None:
        return contextlib.nullcontext()
    device, _, dt = str(spec).rpartition(":")
    if dt == "off":
        return torch.autocast(device or "cpu", enabled=False)
    return torch.autocast(device or "cpu", dtype=getattr(torch, dt))


class RecomputeNet(torch.nn.Module):
    """A trusted function for recomputation graders (activation checkpointing, AMP steps).

    ``spec``: ``{"d_in", "d_hidden", "d_out", "act" ("tanh" | "gelu" | "relu"), "p" (dropout,
    always applied as in training; 0: none), "residual" (add the input: d_in == d_out, a block
    that keeps x's shape)}``. ``forward(x, w=None, alpha=1.0, act=None, idx=None)``:
    ``h = act(inp(x) * w) * alpha`` (``w`` a tensor broadcast over the hidden features, or
    None; ``act`` a string, None: the spec's), dropout, ``y = out(h)`` (+ ``x``), then the
    rows ``idx`` (an integer tensor) of ``y`` when given. Each call appends ``[phase, grad
    enabled, autocast enabled, autocast dtype, seq]`` (autocast of ``x``'s device type; ``seq``
    numbers the calls of every RecomputeNet in this process in order) to ``log``."""

    def __init__(self, spec: dict):
        super().__init__()
        self.inp = torch.nn.Linear(int(spec["d_in"]), int(spec["d_hidden"]))
        self.out = torch.nn.Linear(int(spec["d_hidden"]), int(spec["d_out"]))
        self.act = str(spec.get("act", "tanh"))
        self.p = float(spec.get("p", 0.0))
        self.residual = bool(spec.get("residual", False))
        self.log: list = []

    def forward(self, x, w=None, alpha=1.0, act=None, idx=None):
        _RECOMPUTE_SEQ[0] += 1
        if len(self.log) < 1000:
            self.log.append([_RECOMPUTE_PHASE[0], torch.is_grad_enabled()] + _autocast_state(x.device.type)
                            + [_RECOMPUTE_SEQ[0]])
        h = self.inp(x)
        if w is not None:
            h = h * w
        h = _ACTIVATIONS[act or self.act](h) * alpha
        if self.p:
            h = _dropout(h, self.p, training=True)
        y = self.out(h)
        if self.residual:
            y = y + x
        return y if idx is None else y.index_select(0, idx)


def probe_build_recompute(module, specs, states):
    """A list of :class:`RecomputeNet`, one per spec, each loaded from its state dict (strict),
    kept in this process."""
    nets = []
    for spec, state in zip(specs, states):
        net = RecomputeNet(spec)
        net.load_state_dict(state, strict=True)
        nets.append(net)
    return nets, {"keep": True}


def _ptr(t) -> int:
    return int(t.untyped_storage().data_ptr())


def _custom_nodes(root, limit=10_000):
    """The custom ``autograd.Function`` nodes (``BackwardCFunction``) of the graph behind ``root``."""
    found, seen, stack = [], set(), [root]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, _BackwardCFunction):
            found.append(node)
        stack += [n for n, _ in getattr(node, "next_functions", ())]
    return found


def _graph_saved(root, skip_ptrs, limit=10_000) -> tuple[int, list, set]:
    """Bytes of the distinct storages the graph behind ``root`` holds for backward, read from its
    nodes (``_saved_*`` attributes; a custom node's ``saved_tensors``), those in ``skip_ptrs``
    left out, a few descriptions, and the storages' pointers: a count that no saved-tensors hook
    of the code can hide."""
    seen_nodes, seen, stack, total, desc = set(), set(), [root], 0, []
    while stack and len(seen_nodes) < limit:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        values = []
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    values.append(getattr(node, name))
                except Exception:  # noqa: BLE001 - a freed or unreadable slot holds nothing
                    continue
        if isinstance(node, _BackwardCFunction):
            try:
                values.extend(node.saved_tensors)
            except Exception:  # noqa: BLE001
                pass
        for t in flat(values):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            ptr, nbytes = int(st.data_ptr()), int(st.nbytes())
            if nbytes and ptr not in skip_ptrs and ptr not in seen:
                seen.add(ptr)
                total += nbytes
                if len(desc) < 5:
                    desc.append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} held by {type(node).__name__}")
        stack += [n for n, _ in getattr(node, "next_functions", ())]
    return total, desc, seen


def probe_recompute(module, target, args, kwargs, watch, grad_output, opts):
    """One forward ``out = target(*args, **kwargs)`` and ``torch.autograd.backward(out, grad_output)``,
    watched (``watch``: the trusted modules involved, e.g. :class:`RecomputeNet` s).

    Under ``torch.random.fork_rng`` (this process's RNG is left as it was): ``torch.manual_seed(
    opts["seed"])``; the forward under ``opts["autocast_forward"]`` (see ``_autocast``) and a
    ``saved_tensors_hooks`` pair that records every storage autograd packs (each once; the
    watched modules' parameters left out); ``opts["draws"]`` numbers drawn from the global RNG
    (``mid``); the backward under ``opts["autocast_backward"]``; 8 numbers drawn (``after``).
    ``opts["requires_grad"]``: per positional argument (tensors are detached first);
    ``forbid`` / ``reason`` as in ``measure``, around forward and backward (a saved-tensor hook pair
    pushed by the submission, which would take what autograd saves away from the grader's, fails the
    call: ``guards``).

    Value: ``out`` (detached), ``grads`` (per positional argument), ``param_grads`` (per watched
    module), ``logs`` (per watched module, its ``log`` of this run), ``packed_bytes``,
    ``packed_count``, ``packed`` (a few descriptions), ``grad_fn`` (``{"type", "custom",
    "forward"}``: the output's node, whether it is a custom Function's, and that Function's
    class), ``kept`` (floating tensors that custom nodes of the graph keep as attributes, other
    than the arguments and parameters: descriptions), ``kept_bytes``, ``functions`` (the classes of
    the graph's custom Functions), ``graph_saved_bytes`` and ``graph_saved`` (what the graph's nodes
    hold for backward when forward returns, read from the nodes, parameters left out: a cross-check
    of the hooks' count), ``mid``, ``after``,
    ``backward_error`` (None, or what backward raised), ``forbidden``."""
    leaves = _leaves(args, opts.get("requires_grad", []))
    nets = list(watch) if watch is not None else []
    param_ptrs = {_ptr(p) for net in nets for p in net.parameters()}
    arg_ptrs = {_ptr(a) for a in flat(leaves) if isinstance(a, torch.Tensor)}
    for net in nets:
        net.zero_grad(set_to_none=True)
        if hasattr(net, "log"):
            net.log = []
    packed: dict = {}
    alive: list = []  # the packed tensors, alive until forward ends (no storage reused under a key)

    def pack(t):
        st = t.untyped_storage()
        ptr, nbytes = int(st.data_ptr()), int(st.nbytes())
        if nbytes and ptr not in param_ptrs and ptr not in packed:
            packed[ptr] = (nbytes, f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
            alive.append(t)
        return t

    seen: list = []
    names = list(opts.get("forbid", []))
    reason = opts.get("reason", "the contract forbids it")
    value: dict = {"backward_error": None}
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(opts.get("seed", 0)))
            _RECOMPUTE_PHASE[0] = "forward"
            with _autocast(opts.get("autocast_forward")), _saved_tensors_hooks(pack, lambda t: t):
                with forbid(names, module, reason, seen), guarded():
                    out = target(*leaves, **kwargs)
            alive.clear()
            _RECOMPUTE_PHASE[0] = "between"
            gf = getattr(out, "grad_fn", None)
            fwd = getattr(type(gf), "_forward_cls", None)
            value["grad_fn"] = {"type": f"{type(gf).__module__}.{type(gf).__qualname__}" if gf is not None else "",
                                "custom": isinstance(gf, _BackwardCFunction),
                                "forward": f"{fwd.__module__}.{fwd.__qualname__}" if fwd is not None else ""}
            saved_bytes, saved_desc, saved_ptrs = _graph_saved(gf, param_ptrs)
            kept, kept_bytes, kept_ptrs = [], 0, set()
            for node in _custom_nodes(gf):
                for t in reachable_tensors(node):  # beside what the graph saved (counted there)
                    ptr = _ptr(t)
                    if not t.is_floating_point() or ptr in arg_ptrs or ptr in param_ptrs or ptr in kept_ptrs \
                            or ptr in saved_ptrs:
                        continue
                    kept_ptrs.add(ptr)
                    kept_bytes += int(t.untyped_storage().nbytes())
                    if len(kept) < 5:
                        kept.append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} held by "
                                    f"{type(node).__qualname__}")
            value.update(kept=kept, kept_bytes=kept_bytes, functions=sorted(
                {f"{c.__module__}.{c.__qualname__}" for c in (getattr(type(n), "_forward_cls", None)
                                                            for n in _custom_nodes(gf)) if c is not None}))
            value["graph_saved_bytes"], value["graph_saved"] = saved_bytes, saved_desc
            value["mid"] = torch.rand(int(opts.get("draws", 4)))
            _RECOMPUTE_PHASE[0] = "backward"
            try:
                with _autocast(opts.get("autocast_backward")):
                    with forbid(names, module, reason, seen), guarded():
                        torch.autograd.backward(out, grad_output)
            except AssertionError:
                raise
            except Exception as e:  # noqa: BLE001 - what backward raised is graded, with its words
                value["backward_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            _RECOMPUTE_PHASE[0] = "idle"
            value["after"] = torch.rand(8)
    finally:
        _RECOMPUTE_PHASE[0] = "idle"
    value.update(
        out=detach_tree(out),
        grads=[a.grad.detach().clone() if isinstance(a, torch.Tensor) and a.requires_grad and a.grad is not None
               else None for a in leaves],
        param_grads=[{n: None if p.grad is None else p.grad.detach().clone() for n, p in net.named_parameters()}
                     for net in nets],
        logs=[list(getattr(net, "log", [])) for net in nets],
        packed_bytes=sum(b for b, _ in packed.values()), packed_count=len(packed),
        packed=[d for _, d in sorted(packed.values(), key=lambda bd: -bd[0])[:5]],
        forbidden=sorted(set(seen)))
    return value, {}


class GradScalerAdapter:
    """``torch.amp.GradScaler(device, **kwargs)`` behind the interface the loss-scaler graders
    drive: ``scale(loss)``, ``unscale_(optimizer)``, ``step(optimizer) -> bool`` (whether the
    optimizer stepped), ``update()``, ``scale_value`` (a float). Trusted: the graders' oracle."""

    def __init__(self, device: str = "cpu", **kwargs):
        self.scaler = _GradScaler(device, **kwargs)

    def scale(self, loss):
        return self.scaler.scale(loss)

    def unscale_(self, optimizer):
        self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> bool:
        self.scaler.step(optimizer)
        state = self.scaler._per_optimizer_states[id(optimizer)]
        return not sum(float(v.item()) for v in state["found_inf_per_device"].values())

    def update(self):
        self.scaler.update()

    @property
    def scale_value(self) -> float:
        return float(self.scaler.get_scale())


def _optimizer(spec: dict, params):
    """``torch.optim.SGD`` (``{"name": "sgd", "lr", "momentum"}``) or ``AdamW``
    (``{"name": "adamw", "lr", "weight_decay"}``) over ``params``."""
    params = list(params)
    if spec.get("name", "sgd") == "adamw":
        return torch.optim.AdamW(params, lr=float(spec.get("lr", 1e-2)), weight_decay=float(spec.get("weight_decay", 0.0)))
    return torch.optim.SGD(params, lr=float(spec.get("lr", 0.1)), momentum=float(spec.get("momentum", 0.0)))


def _opt_state(opt) -> list:
    """Per parameter (in param-group order), its optimizer state's tensors (copies) and numbers."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            out.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in st.items()
                        if isinstance(v, (torch.Tensor, int, float))})
    return out


def _scale_value(scaler):
    v = getattr(scaler, "scale_value")
    return v if type(v) in (float, int) else f"<{type(v).__name__}>"


def _counting_step(opt):
    """Count ``opt.step`` calls (an instance attribute in front of the class's method)."""
    calls = [0]
    inner = opt.step

    def step(*a, **k):
        calls[0] += 1
        return inner(*a, **k)
    opt.step = step
    return calls


def probe_scaler_run(module, target, kwargs, params, script, opts):
    """Drive a loss scaler ``target(**kwargs)`` (a class: the submission's, or
    :class:`GradScalerAdapter`) as a training loop does, on float32 parameters (copies of
    ``params``) and the optimizer ``opts["optimizer"]`` (see ``_optimizer``). Step ``i`` of
    ``script`` (``{"grads": [one tensor per parameter, inf/NaN allowed], "unscale": bool,
    "twice": bool}``): ``zero_grad``; ``loss = sum((p * g).sum())``; ``scaler.scale(loss).backward()``
    (each ``.grad`` is then ``scale * g``); with ``unscale``, ``scaler.unscale_(opt)`` (with
    ``twice`` a second time, its exception's type recorded; no backward where the scaled loss does
    not require grad); ``stepped = scaler.step(opt)``;
    ``scaler.update()``. Value: ``init_scale`` (``scale_value`` before the first step) and per
    step ``scaled`` (the scaled loss, detached), ``scaled_requires_grad``, ``grads`` (after an
    explicit ``unscale_``, else None), ``twice`` (None, "no error" or the exception type),
    ``stepped`` (what ``step`` returned), ``calls`` (``optimizer.step`` calls it made), ``scale``
    (``scale_value`` after ``update``), ``params`` and ``state`` (the optimizer's)."""
    scaler = target(**kwargs)
    ps = [torch.nn.Parameter(p.detach().clone().to(torch.float32)) for p in params]
    opt = _optimizer(opts.get("optimizer", {}), ps)
    calls = _counting_step(opt)
    steps = []
    value = {"init_scale": _scale_value(scaler), "steps": steps}
    for item in script:
        rec: dict = {"grads": None, "twice": None}
        opt.zero_grad(set_to_none=True)
        loss = sum((p * g.to(torch.float32)).sum() for p, g in zip(ps, item["grads"]))
        scaled = scaler.scale(loss)
        rec["scaled"] = scaled.detach().clone() if isinstance(scaled, torch.Tensor) else scaled
        rec["scaled_requires_grad"] = bool(getattr(scaled, "requires_grad", False))
        if rec["scaled_requires_grad"]:  # else no gradient reaches the parameters (graded from the flag)
            scaled.backward()
        if item.get("unscale"):
            scaler.unscale_(opt)
            rec["grads"] = [None if p.grad is None else p.grad.detach().clone() for p in ps]
            if item.get("twice"):
                try:
                    scaler.unscale_(opt)
                    rec["twice"] = "no error"
                except Exception as e:  # noqa: BLE001 - the type is graded
                    rec["twice"] = type(e).__name__
        before = calls[0]
        stepped = scaler.step(opt)
        rec["stepped"] = stepped if type(stepped) in (bool, type(None)) else f"<{type(stepped).__name__}>"
        rec["calls"] = calls[0] - before
        scaler.update()
        rec["scale"] = _scale_value(scaler)
        rec["params"] = [p.detach().clone() for p in ps]
        rec["state"] = _opt_state(opt)
        steps.append(rec)
    return value, {}


def probe_train_steps(module, target, spec, state, batches, scaler, opts):
    """Training steps ``loss = target(model, (inputs, targets), loss_fn, optimizer, scaler[, dtype=])``
    of a trusted :class:`RecomputeNet` (``spec``, ``state``; ``opts["double"]``: in float64),
    one per ``(inputs, targets)`` of ``batches``. ``opts``: ``loss`` (a name in
    ``TORCH_FUNCTIONS``), ``optimizer`` (see ``_optimizer``), ``scaler_kwargs`` (``scaler``:
    a class made with them, ``"torch.amp.GradScaler"`` for :class:`GradScalerAdapter`, or None:
    no scaler), ``dtype`` (passed by keyword when given),
    ``stale`` (every ``.grad`` holds this value before the first step: a step must clear it).
    Value per step: ``loss`` (what ``target`` returned, detached), ``loss_requires_grad``,
    ``params``, ``dtypes`` (of the parameters), ``state`` (the optimizer's), ``scale``
    (``scale_value`` after the step, None without a scaler) and ``log`` (the model's calls)."""
    net = RecomputeNet(spec)
    net.load_state_dict(state, strict=True)
    if opts.get("double"):
        net = net.double()
    opt = _optimizer(opts.get("optimizer", {}), net.parameters())
    loss_fn = TORCH_FUNCTIONS[opts.get("loss", "torch.nn.functional.mse_loss")]
    if scaler == "torch.amp.GradScaler":
        scaler = GradScalerAdapter
    sc = scaler(**opts.get("scaler_kwargs", {})) if scaler is not None else None
    if opts.get("stale") is not None:
        for p in net.parameters():
            p.grad = torch.full_like(p, float(opts["stale"]))
    extra = {"dtype": opts["dtype"]} if "dtype" in opts else {}
    steps = []
    try:
        _RECOMPUTE_PHASE[0] = "train"
        for x, t in batches:
            net.log = []
            with guarded():
                loss = target(net, (x, t), loss_fn, opt, sc, **extra)
            steps.append({"loss": loss.detach().clone() if isinstance(loss, torch.Tensor) else loss,
                          "loss_requires_grad": bool(getattr(loss, "requires_grad", False)),
                          "params": {n: p.detach().clone() for n, p in net.named_parameters()},
                          "dtypes": {n: str(p.dtype).removeprefix("torch.") for n, p in net.named_parameters()},
                          "state": _opt_state(opt), "scale": _scale_value(sc) if sc is not None else None,
                          "log": list(net.log)})
    finally:
        _RECOMPUTE_PHASE[0] = "idle"
    return steps, {}
