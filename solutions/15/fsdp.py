"""Lab 15 reference: fully sharded data parallelism (ZeRO-3 / FSDP) from scratch.

Every rank keeps 1/W of every unit's flat parameter (Rajbhandari et al., SC 2020, "ZeRO"
stage 3; Zhao et al., VLDB 2023, "PyTorch FSDP", sec. 3). A unit's full parameters exist
only while it computes: all-gathered into one padded flat buffer before its forward, freed
after it (``untyped_storage().resize_(0)``, FSDP1's way: autograd's saved views keep the
storage object, not its bytes), gathered again into the same storage before its backward
(written through ``.data``, so autograd's version check does not fire), and freed once its
gradient has been reduce-scattered into the shard.

Per forward, each flat buffer gets a fresh leaf ``flat`` and fresh views of it (views made
once at construction would have backward nodes that run last: every reduce-scatter would
wait for the end of backward, pytorch/pytorch #160320). ``flat``'s post-accumulate-grad
hook runs as soon as the unit's gradient is complete: it reduce-scatters (SUM, then / W),
adds the result to the shard's ``.grad`` and frees the buffer.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn


class _Flat:
    """One flat parameter of one unit: its shard (an ``nn.Parameter`` of shape ``(c,)``), the
    registrations ``(module, name)`` of each original parameter with its shape, and the
    padded full buffer (``W * c`` elements; its storage resized to 0 bytes while freed)."""

    def __init__(self, entries, shard, numel, W):
        self.entries = entries  # [(shape, numel, [(module, name), ...]), ...] in flat order
        self.shard = shard
        self.numel = numel
        self.W = W
        self.full = None    # the padded flat buffer, allocated at the first gather
        self.leaf = None    # this forward's leaf over ``full`` (trainable flats only)
        self.work = None    # an all-gather in flight (prefetch)

    @property
    def gathered(self) -> bool:
        return self.full is not None and self.full.untyped_storage().nbytes() > 0

    def gather(self, group, async_op=False):
        """All-gather the shards straight into the full buffer (refilling its storage)."""
        c = self.shard.numel()
        if self.full is None:
            self.full = torch.empty(self.W * c, dtype=self.shard.dtype, device=self.shard.device)
        elif not self.gathered:
            self.full.untyped_storage().resize_(self.W * c * self.full.element_size())
        self.work = dist.all_gather_single(self.full.data, self.shard.detach(), group=group, async_op=async_op)
        if not async_op:
            self.work = None

    def wait(self):
        if self.work is not None:
            self.work.wait()
            self.work = None

    def free(self):
        self.wait()
        self.leaf = None
        if self.gathered:
            self.full.untyped_storage().resize_(0)

    def set_views(self, trainable: bool):
        """Fresh views of the full buffer on every registration of every parameter."""
        base = self.full
        if trainable:
            base = self.leaf = self.full.detach().requires_grad_(True)
        offset = 0
        for shape, numel, regs in self.entries:
            view = base[offset:offset + numel].view(shape)
            for m, name in regs:
                setattr(m, name, view)
            offset += numel


class FSDP(nn.Module):
    """Fully sharded data parallelism: see the module docstring and README.md."""

    def __init__(self, module, units, group=None, prefetch=False):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        if not isinstance(units, (list, tuple)) or not all(isinstance(u, nn.Module) for u in units):
            raise TypeError("units must be a list or tuple of nn.Module")
        if not isinstance(prefetch, bool):
            raise TypeError(f"prefetch must be a bool, got {type(prefetch).__name__}")
        inside = {id(m) for m in module.modules()}
        ids = [id(u) for u in units]
        if any(i not in inside or u is module for i, u in zip(ids, units)):
            raise ValueError("units must be proper submodules of module")
        if len(set(ids)) != len(ids):
            raise ValueError("units must be pairwise distinct")
        members = [{id(m) for m in u.modules()} for u in units]
        for i, u in enumerate(units):
            for j in range(len(units)):
                if i != j and id(u) in members[j]:
                    raise ValueError(f"units must not be nested: units[{i}] is inside units[{j}]")
        params = list(module.parameters())
        dtypes = sorted({str(p.dtype) for p in params})
        if len(dtypes) > 1 or any(not p.is_floating_point() for p in params) or len({p.device for p in params}) > 1:
            raise TypeError(f"every parameter must have one floating dtype and one device, got dtypes {dtypes}")
        self.module = module
        self.group = group
        self.W = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.prefetch = prefetch

        # construction broadcast: parameters and buffers take group rank 0's values, in place
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, group_src=0, group=group)

        # ownership: every registration inside one unit -> that unit; otherwise the root
        regs: dict[int, list] = {}  # id(parameter) -> every (module, name) it is registered under
        for _, m in module.named_modules(remove_duplicate=False):
            for name, p in m._parameters.items():
                if p is not None and not any(a is m and b == name for a, b in regs.setdefault(id(p), [])):
                    regs[id(p)].append((m, name))
        root = len(units)

        def owner(p):
            where = {next((i for i, mem in enumerate(members) if id(m) in mem), root) for m, _ in regs[id(p)]}
            return where.pop() if len(where) == 1 else root

        self._names = []  # module.named_parameters() at construction, for full_state_dict
        per_unit = [([], []) for _ in range(root + 1)]  # (trainable, frozen) parameters per unit, flat order
        for i, u in enumerate(list(units) + [module]):
            for name, p in u.named_parameters():
                if owner(p) == i:
                    per_unit[i][0 if p.requires_grad else 1].append(p)
        for name, p in module.named_parameters():
            self._names.append((name, p))

        self.shards = nn.ParameterList()
        self._units = list(units)
        self._flats = []  # per unit (root last): [trainable _Flat or None, frozen _Flat or None]
        self._where = {}  # id(original parameter) -> (_Flat, offset, numel, shape)
        for i in range(root + 1):
            pair = []
            for k, ps in enumerate(per_unit[i]):
                if not ps:
                    pair.append(None)
                    continue
                N = sum(p.numel() for p in ps)
                c = math.ceil(N / self.W)
                with torch.no_grad():
                    flat = torch.cat([p.detach().reshape(-1) for p in ps])
                    flat = torch.nn.functional.pad(flat, (0, self.W * c - N))
                    shard = nn.Parameter(flat[self.rank * c:(self.rank + 1) * c].clone(), requires_grad=(k == 0))
                entries, offset = [], 0
                f = _Flat(entries, shard, N, self.W)
                for p in ps:
                    entries.append((p.shape, p.numel(), regs[id(p)]))
                    self._where[id(p)] = (f, offset, p.numel(), p.shape)
                    offset += p.numel()
                self.shards.append(shard)
                pair.append(f)
            self._flats.append(pair)
        self._names = [(n, self._where[id(p)]) for n, p in self._names]
        for p_id, lst in regs.items():
            for m, name in lst:
                del m._parameters[name]
        for pair in self._flats:  # FSDP1-style attributes between forwards: views into a freed buffer
            for f in pair:
                if f is not None:
                    f.full = torch.empty(self.W * f.shard.numel(), dtype=f.shard.dtype, device=f.shard.device)
                    f.set_views(trainable=False)
                    f.free()

        self._queued = False
        for i, u in enumerate(units):
            u.register_forward_pre_hook(self._pre_forward(i))
            u.register_forward_hook(self._post_forward(i))

    # ------------------------------------------------------------------ gathering and freeing

    def _gather(self, i, async_op=False):
        for f in self._flats[i]:
            if f is not None and not f.gathered:
                f.gather(self.group, async_op=async_op)

    def _ready(self, i):
        """Unit i gathered (waiting for a prefetch in flight)."""
        self._gather(i)
        for f in self._flats[i]:
            if f is not None:
                f.wait()

    def _views(self, i):
        for k, f in enumerate(self._flats[i]):
            if f is not None:
                f.set_views(trainable=(k == 0))
                if k == 0:
                    f.leaf.register_post_accumulate_grad_hook(self._grad_ready(i, f))

    def _free(self, i):
        for f in self._flats[i]:
            if f is not None:
                f.free()

    def _pre_forward(self, i):
        def hook(unit, args):
            self._ready(i)
            if self.prefetch and i + 1 < len(self._units):
                self._gather(i + 1, async_op=True)
            self._views(i)
        return hook

    def _post_forward(self, i):
        def hook(unit, args, out):
            self._free(i)  # reshard after forward
            if torch.is_grad_enabled():
                outs = [t for t in (out if isinstance(out, (tuple, list)) else [out])
                        if isinstance(t, torch.Tensor) and t.requires_grad]
                fired = []
                for t in outs:
                    t.register_hook(self._pre_backward(i, fired))
            return out
        return hook

    def _pre_backward(self, i, fired):
        def hook(grad):
            if not fired:
                fired.append(True)
                self._ready(i)
                if self.prefetch and i >= 1:
                    self._gather(i - 1, async_op=True)  # BACKWARD_PRE
            return grad
        return hook

    def _grad_ready(self, i, f):
        def hook(leaf):
            grad = leaf.grad
            leaf.grad = None
            c = f.shard.numel()
            out = torch.empty(c, dtype=grad.dtype, device=grad.device)
            dist.reduce_scatter_single(out, grad.contiguous(), op=dist.ReduceOp.SUM, group=self.group)
            out.div_(self.W)
            if f.shard.grad is None:
                f.shard.grad = out
            else:
                f.shard.grad.add_(out)
            self._free(i)
        return hook

    def _end_of_backward(self):
        self._queued = False
        for i in range(len(self._flats)):
            self._free(i)

    def _queue_end(self, grad):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        return grad

    # ------------------------------------------------------------------ forward

    def forward(self, *args, **kwargs):
        root = len(self._units)
        self._ready(root)
        self._views(root)
        try:
            out = self.module(*args, **kwargs)
        except BaseException:
            for i in range(root + 1):
                self._free(i)
            raise
        outs = [t for t in (out if isinstance(out, (tuple, list)) else [out])
                if isinstance(t, torch.Tensor) and t.requires_grad]
        if not torch.is_grad_enabled() or not outs:
            for i in range(root + 1):
                self._free(i)
        else:
            for t in outs:
                t.register_hook(self._queue_end)
        return out

    # ------------------------------------------------------------------ reading the parameters back

    def full_state_dict(self) -> dict:
        """The full parameters (names at construction, ties once) and this rank's buffers: new tensors."""
        full = {}
        for pair in self._flats:
            for f in pair:
                if f is not None:
                    buf = torch.empty(f.W * f.shard.numel(), dtype=f.shard.dtype, device=f.shard.device)
                    dist.all_gather_single(buf, f.shard.detach(), group=self.group)
                    full[id(f)] = buf
        state = {}
        for name, (f, offset, numel, shape) in self._names:
            state[name] = full[id(f)][offset:offset + numel].view(shape).clone()
        for name, b in self.module.named_buffers():
            state[name] = b.detach().clone()
        return state
