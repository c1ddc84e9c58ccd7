"""The ranks of multi-rank labs: W ranks of the submission inside the sandbox, driven from the grader.

Graders of the distributed labs (01 all-reduce, 02 ZeRO) call::

    results = harness.toolkit.run_ranks(body, W, *args, impl=impl, timeout=20)

The W ranks are W request loops of one sandboxed worker (``harness.sandbox``):
they share the worker's private network namespace and nothing else (each has its own
``/tmp``, ``/dev/shm`` and System V IPC), join a fresh ``torch.distributed`` process
group through a ``TCPStore`` rank 0 serves on the private loopback (gloo on CPU over
the loopback; nccl with ``device="cuda"`` and at least W GPUs), and reach nothing
else, so whatever they exchange crosses the loopback the grader measures. Only values cross back (the wire format; never pickle).

``body(rk, *args, **kwargs)`` is grader code and runs in the *trusted* process,
one thread per rank, driving its rank through ``rk`` (a :class:`RankProxy`):
``rk.rank``, ``rk.world_size``, ``rk.impl`` (the implementation on that rank:
``rk.impl.f(x)`` runs there), and the probes :meth:`RankProxy.call` (a call under
the communication counter and forbidden collectives, with the arguments as they
are after the call), :meth:`RankProxy.keep` (a value kept on the rank, e.g. a
parameter an optimizer holds), :meth:`RankProxy.new_groups`,
:meth:`RankProxy.reachable_bytes` and :meth:`RankProxy.resident_bytes`. Inputs
are built by the grader and sent as tensors; the seed never reaches a rank.
``run`` returns the W return values of ``body``, in rank order.

Failures
  * A rank that raises fails the run with :class:`RankError` naming the rank and
    the exception (root causes first: a peer's "connection closed" comes after).
    A rank that dies (``os._exit``, a signal) is named with its exit status.
  * A run past ``timeout`` seconds (a deadlock: with gloo a blocking ``send`` waits
    for its matching ``recv``) fails with :class:`RankTimeout`, naming where each
    rank waited (its last communication call, from the counter's notes). The
    worker is killed and a fresh one serves the next run.
  * Timeouts and crashes count in the lab's :class:`harness.sandbox.Budget`: after
    two timed-out runs the remaining runs of that submission fail at once.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from . import calls as _sb
from . import isolation
from .outside import HARD_CAP, loopback_tx_bytes, tcp_retransmits
from .probes.comm import COLLECTIVES, DATA_COLLECTIVES, P2P  # noqa: F401  (graders name them)
from .wire import View  # noqa: F401  (graders send views with their base)
from .worker import (Budget, RemoteModule, Sandbox, SandboxError, SandboxStartError, WorkerConfig,
                     WorkerCrashed, WorkerTimeout)

ERROR_GRACE_S = 3.0  # after one rank fails, how long the others get to report before the worker is killed
_GLOO_TIMEOUT = "Timed out waiting"
_SECONDARY = (_GLOO_TIMEOUT, "Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "another rank failed first", "stopped answering")


class RankError(AssertionError):
    """A rank raised or died; the message names the rank, the exception and its traceback."""


class RankTimeout(AssertionError):
    """A run exceeded its timeout (a deadlock or a far too slow rank)."""


@dataclasses.dataclass
class Call:
    """What :meth:`RankProxy.call` saw: ``out`` (the return value), ``args`` (the
    positional arguments after the call; a ``View`` argument as its whole base),
    ``same`` (per argument: the output is that very object), ``comm`` (the
    communication counter's report) and ``m`` (the full Measurement)."""

    out: Any
    args: list
    same: list
    comm: dict
    m: Any


@dataclasses.dataclass
class Step:
    """What :meth:`RankProxy.backward` saw: ``grads`` and ``params`` (name to tensor, of the
    model after backward and after the step), ``comm`` (the counter's report), ``events``
    (its ordered log: ``ready`` (a gradient accumulated, ``p`` its name), ``launch`` (a
    collective: ``op``, ``numel``, ``dtype``, ``async_op``, and for a floating CPU tensor ``sum``:
    its float64 sum as launched), ``send``/``recv``, ``wait``
    (``Work.wait``/``Future.wait``), ``c10d`` (a collective dispatcher op: ``op``, ``numel``
    (the elements of its first argument), and for an all-to-all ``sent``: the elements it sends
    to the other ranks, its own split left out (``harness.alloc.c10d_sent_elements``); however
    it was reached), ``forward_done``, ``backward_done``) and ``m``; with
    ``input_grads``: ``out`` and ``input_grads`` (per argument, None for a non-tensor)."""

    grads: dict
    params: dict
    comm: dict
    events: list
    m: Any
    out: Any = None
    input_grads: list | None = None


class RankProxy:
    """One rank, seen from the grader's thread that drives it."""

    def __init__(self, group: "_RankGroup", rank: int, world_size: int, device: str, backend: str):
        self._group = group
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.backend = backend
        self.impl = RemoteModule(group.sandbox, group.path, group.name, server=rank)
        self.last_note = ""

    def note(self, msg: str) -> None:
        """The grader's own progress note for this rank (shown if the run times out)."""
        self.last_note = str(msg)[:300]

    def call(self, fn, *args, forbid_collectives=(), forbid=(), alloc: bool = False, c10d: bool = False,
             **kwargs) -> Call:
        """``fn(*args, **kwargs)`` on this rank under the communication counter;
        ``forbid_collectives`` (names from ``COLLECTIVES``) raise in the rank and are
        recorded even if swallowed; ``forbid``: dotted names as in ``measure``; ``c10d``:
        also log every collective dispatcher op (``c10d`` events, see :class:`Step`)."""
        opts = {"alloc": alloc, "ops": alloc or c10d or bool(forbid_collectives), "comm": True,
                "comm_forbid": list(forbid_collectives),
                "forbid": list(forbid), "return_args": True}
        value, figures, outside = _sb.run_probe("measure", target=fn, args=list(args), kwargs=kwargs, opts=opts,
                                                what=f"rank {self.rank}: calling {getattr(fn, '_short', fn)}")
        m = _sb.measurement_from(figures, outside)
        if not (isinstance(value, dict) and isinstance(value.get("args"), list)
                and isinstance(value.get("same"), list) and len(value["args"]) == len(args)):
            raise SandboxError("the implementation's process sent a malformed call report")
        comm = m.comm or {"forbidden": ["<no report>"], "collectives": {}, "sent_bytes": 1 << 62, "events": []}
        if m.forbidden_called:  # a forbidden name called, even where the error was swallowed
            raise AssertionError(f"rank {self.rank} called {', '.join(sorted(set(m.forbidden_called)))}: the "
                                 "contract forbids it")
        if comm["forbidden"]:  # even where the call went on (an error swallowed, a c10d op seen afterwards)
            raise AssertionError(f"rank {self.rank} called {', '.join(sorted(set(comm['forbidden'])))}: the contract "
                                 "forbids collectives here (point-to-point send/recv only)")
        return Call(value.get("out"), value["args"], [x is True for x in value["same"]], comm, m)

    def build_model(self, spec: dict, state: dict | None, device: str = "cpu"):
        """A trusted :class:`TrainNet` (``spec``, loaded with the state dict ``state``; None:
        ``seeded_state(spec, spec["seed"])`` drawn on the rank, for a model too large to send) built
        on this rank, on ``device``; returns a handle to it."""
        return _sb.run_probe("build_model", on=self.impl, spec=spec, state=state, device=str(device),
                             what=f"rank {self.rank}: building the model")[0]

    def torch_ddp(self, model, bucket_cap_mb: float):
        """``torch.nn.parallel.DistributedDataParallel`` around ``model`` (a handle) on this
        rank, trusted code: the baseline of a data-parallel step time. Returns a handle."""
        return _sb.run_probe("torch_ddp", target=model, bucket_cap_mb=float(bucket_cap_mb),
                             what=f"rank {self.rank}: wrapping the model in torch's DDP")[0]

    def fully_shard(self, model, units: list):
        """torch's ``fully_shard`` (FSDP2, ``reshard_after_forward=True``) on every module of
        ``units`` (handles) and then on ``model`` (a handle) on this rank, trusted code: the baseline
        of a fully sharded step time. Returns the handle of the sharded ``model``."""
        return _sb.run_probe("fully_shard", target=model, units=list(units),
                             what=f"rank {self.rank}: applying torch's fully_shard")[0]

    def nothing(self):
        """A handle to a callable that does nothing: the candidate beside a trusted baseline timed
        alone (``timed(rk.nothing(), baseline, ...)`` on clean twin ranks)."""
        return _sb.run_probe("nothing", on=self.impl, what=f"rank {self.rank}: a no-op")[0]

    def step_fn(self, module, adamw: dict | None = None, digests: bool = False):
        """A handle to ``step(x, grad_output) -> [out, grads]``: forward of ``module`` (a
        handle), backward, the gradients taken off the parameters (each as its ``digest`` with
        ``digests``), then with ``adamw`` (``torch.optim.AdamW``'s keyword arguments) an AdamW
        step on ``module.parameters()`` (``probes.probe_step_fn``). What
        :func:`harness.toolkit.timed` times for a training step."""
        return _sb.run_probe("step_fn", target=module, adamw=adamw, digests=bool(digests),
                             what=f"rank {self.rank}: a step function")[0]

    def stage_stats(self, model, reset: bool = False) -> dict | None:
        """What a watched :class:`TrainNet` (``spec["watch"]``) on this rank saw: ``rows`` (of
        each call's input), ``actions`` (``["F", call]`` / ``["B", call]`` in order: a forward
        call, the start of its backward), ``peak_held`` (most calls holding saved tensors at
        once) and ``held`` (now). ``reset`` clears them (before a call)."""
        return _sb.run_probe("stage_stats", target=model, reset=reset, what=f"rank {self.rank}: reading the stage")[0]

    def torch_function(self, name: str):
        """A handle to a trusted torch function on this rank (``probes.TORCH_FUNCTIONS``, e.g.
        ``"torch.nn.functional.mse_loss"``), to pass to the submission."""
        return _sb.run_probe("torch_function", on=self.impl, dotted=name, what=f"rank {self.rank}: {name}")[0]

    def wraps(self, wrapper, model) -> dict:
        """Whether ``wrapper`` (a handle) holds ``model`` (a :meth:`build_model` handle) itself:
        ``{"module", "same_params", "same_buffers"}`` (see ``probes.probe_wraps``)."""
        return _sb.run_probe("wraps", target=wrapper, model=model, what=f"rank {self.rank}: inspecting the wrapper")[0]

    def state(self, obj) -> dict:
        """``obj.state_dict()`` on this rank (``obj`` a handle), as detached copies."""
        return _sb.run_probe("state", target=obj, what=f"rank {self.rank}: reading the state")[0]

    def build_linear(self, weight: torch.Tensor, bias: torch.Tensor | None):
        """A ``torch.nn.Linear`` holding copies of ``weight (out, in)`` and ``bias (out,)`` (or
        None), built on this rank; returns a handle to it."""
        return _sb.run_probe("build_linear", on=self.impl, weight=weight, bias=bias,
                             what=f"rank {self.rank}: building a linear layer")[0]

    def backward(self, fn, model, *args, grad_output, no_sync: bool = False, lr: float | None = None,
                 input_grads: bool = False, forbid=(), forbid_collectives=(), **kwargs) -> "Step":
        """One training step on this rank (see ``probes.probe_backward``): ``fn(*args, **kwargs)``
        backward with ``grad_output`` (inside ``fn.no_sync()`` if ``no_sync``), then SGD with
        ``lr`` on ``model`` (a handle to an ``nn.Module``). With ``input_grads`` the floating
        tensor arguments require grad, and the Step carries ``out`` and their gradients
        (``input_grads``; no SGD). Returns a :class:`Step`."""
        opts = {"no_sync": bool(no_sync), "lr": lr, "forbid": list(forbid), "comm_forbid": list(forbid_collectives),
                "input_grads": bool(input_grads)}
        value, figures, outside = _sb.run_probe("backward", target=fn, model=model, args=list(args), kwargs=kwargs,
                                                grad_output=grad_output, opts=opts,
                                                what=f"rank {self.rank}: a training step of {getattr(fn, '_short', fn)}")
        m = _sb.measurement_from(figures, outside)
        if not (isinstance(value, dict) and isinstance(value.get("grads"), dict)
                and isinstance(value.get("params"), dict)):
            raise SandboxError("the implementation's process sent a malformed step report")
        comm = m.comm or {"forbidden": ["<no report>"], "collectives": {}, "sent_bytes": 1 << 62, "events": []}
        if m.forbidden_called:
            raise AssertionError(f"rank {self.rank} called {', '.join(sorted(set(m.forbidden_called)))}: the "
                                 "contract forbids it")
        if comm["forbidden"]:
            raise AssertionError(f"rank {self.rank} called {', '.join(sorted(set(comm['forbidden'])))}: the "
                                 "contract forbids it here")
        return Step(value["grads"], value["params"], comm, comm.get("events", []), m, value.get("out"),
                    value.get("input_grads"))

    def keep(self, value):
        """Send ``value`` to this rank and keep it there; returns a handle to it."""
        return _sb.run_probe("keep", on=self.impl, value=value, what=f"rank {self.rank}: sending a value")[0]

    def new_groups(self, members: list) -> list:
        """``torch.distributed.new_group(m)`` for each list in ``members`` (every rank
        must call this with the same lists); the handles of this rank's groups, None
        where it is not a member."""
        return _sb.run_probe("new_groups", on=self.impl, members=[list(m) for m in members],
                             what=f"rank {self.rank}: creating groups")[0]

    def reachable_bytes(self, obj, exclude=()) -> dict:
        """Bytes of tensor storage reachable from ``obj`` on this rank (see sandbox.reachable_bytes)."""
        return _sb.reachable_bytes(obj, exclude)

    def resident_bytes(self, obj) -> int | None:
        """Live memory of this rank's process, in bytes, read from outside it (see
        sandbox.resident_bytes): ``obj`` is a handle on this rank (``rk.impl``, an object).
        State kept where introspection cannot see it (a module-level dict, a closure) counts."""
        return _sb.resident_bytes(obj)


class _RankSandbox(Sandbox):
    """A sandbox of W servers used for one run at a time: it is never restarted
    mid-run, and the first failure stops every rank (the others would wait forever)."""

    def __init__(self, cfg: WorkerConfig, path: Path, budget: Budget):
        super().__init__(cfg, path, budget)
        self.failed: str | None = None

    def request(self, header, buffers, what, server=0, timeout=None, max_bytes=None):
        w = self.worker
        if w is None or self.failed is not None:
            raise WorkerCrashed(f"another rank failed first ({self.failed or 'no worker'})")
        self.calls += 1
        try:
            reply, bufs = w.request(server, header, buffers, what, timeout=timeout, max_bytes=max_bytes,
                                    cleanup=w.terminate)
        except SandboxError as e:
            if self.failed is None:
                self.failed = f"rank {server}: {type(e).__name__}"
            w.terminate()
            raise
        return reply, bufs, w


class _RankGroup:
    """The ranks of one implementation for one world size (kept for the session)."""

    def __init__(self, cfg: WorkerConfig, path: Path, name: str, budget: Budget):
        self.path, self.name = Path(path), name
        self.sandbox = _RankSandbox(cfg, self.path, budget)
        self.runs = itertools.count()

    def close(self):
        self.sandbox.close()


_GROUPS: dict = {}
_LOCAL_BUDGETS: dict = {}
_LOCK = threading.Lock()


def _group_for(impl, world_size: int, clean: bool = False) -> _RankGroup:
    """The rank group of ``impl`` (a sandboxed module, or a module imported locally) with W ranks;
    ``clean``: its twin, the same sandbox with an empty module in place of the implementation
    (ranks no submission code ever ran in) and a budget of its own."""
    if isinstance(impl, RemoteModule):
        base = impl._sandbox
        key = (id(base), world_size, clean)
        cfg = dataclasses.replace(base.cfg, servers=world_size, ranks=True)
        path, name, budget = Path(impl.__file__), impl.__name__, base.budget
    else:
        file = getattr(impl, "__file__", None)
        if not file:
            raise ValueError(f"impl must be the lab's implementation module, got {impl!r}")
        path = Path(file).resolve()
        key = (str(path), world_size, clean)
        cfg = WorkerConfig(module_source=path.read_text(errors="replace"), module_filename=path.name,
                           servers=world_size, ranks=True)
        name, budget = getattr(impl, "__name__", path.stem), _LOCAL_BUDGETS.setdefault(str(path), Budget())
    if clean:
        cfg = dataclasses.replace(cfg, module_source="", stub_source=None, api=[])
        budget = Budget()
    with _LOCK:
        group = _GROUPS.get(key)
        if group is None:
            group = _GROUPS[key] = _RankGroup(cfg, path, name, budget)
    return group


@atexit.register
def shutdown() -> None:
    """Stop every rank group (also run at interpreter exit and by the pytest plugin)."""
    for key in list(_GROUPS):
        group = _GROUPS.pop(key)
        with contextlib.suppress(Exception):
            group.close()


def collective_family(op: str) -> str:
    """The collective an event's op names, however it was spelt (``allreduce_``, ``all_reduce``,
    ``alltoall_base_``, ``all_to_all_single``, ...): ``allreduce``, ``allgather``, ``reducescatter``,
    ``alltoall``, ``broadcast``, ``reduce``, ``gather``, ``scatter``, or the op flattened."""
    flat = op.strip("_").replace("_", "").removesuffix("base").removesuffix("coalesced").removesuffix("single")
    for fam in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "gather", "scatter"):
        if flat.startswith(fam):
            return fam
    return flat


def check_one_counter(events: list, case: str) -> None:
    """Every collective of a rank's call (``events``: ``rk.call(..., c10d=True).comm["events"]``)
    is counted by both counters: the ``torch.distributed`` stand-ins (``launch``: the functions, the
    group's and its backend's methods, from any thread) and the dispatcher's ``c10d`` ops
    (``torch.ops.c10d``, this thread only) log the same collectives. A backend method or a helper
    thread reaches the first only, a ``torch.ops.c10d`` call the second only. (Functional
    collectives, ``_c10d_functional``, end in dispatcher ops alone and are counted there.) Raises
    AssertionError naming ``case`` otherwise."""
    launched = sorted(collective_family(e.get("op") or "") for e in events if e["k"] == "launch")
    dispatched = sorted(collective_family(e.get("op") or "") for e in events if e["k"] == "c10d"
                        and ((e.get("op") or "").endswith("_") or e.get("op") == "barrier"))
    assert launched == dispatched, (
        f"{case}: the collectives seen through torch.distributed ({', '.join(launched) or 'none'}) are not the "
        f"collective dispatcher ops that ran on the calling thread ({', '.join(dispatched) or 'none'}): a collective "
        "issued on the group's backend object, from another thread or past torch.distributed; every collective goes "
        "through torch.distributed, on the calling thread")


def choose_backend(device: str, world_size: int) -> str:
    """``nccl`` for ``device="cuda"`` with at least ``world_size`` GPUs, else ``gloo``."""
    if str(device).startswith("cuda"):
        if torch.cuda.device_count() < world_size:
            raise ValueError(f"device=cuda with W={world_size} needs {world_size} GPUs, "
                             f"{torch.cuda.device_count()} visible")
        return "nccl"
    return "gloo"


class Results(list):
    """The W results of :func:`run`, in rank order, and ``loopback_bytes``: the bytes the
    ranks' private loopback carried during the run (every rank's sends, gloo's own few
    KB of set-up and the TCP/IP headers included), read by the trusted side from
    /proc/<pid>/net/dev, outside every rank, so no code in a rank can hide what it sent;
    ``tcp_retransmits``: the TCP segments sent again meanwhile (read the same way). Both
    None where the ranks share this machine's network (no network namespace)."""

    loopback_bytes: int | None = None
    tcp_retransmits: int | None = None  # segments TCP sent again in that namespace (counted twice on lo)


def run(body: Callable, world_size: int, *args, impl, timeout: float = 30.0, device: str = "cpu",
        clean: bool = False, **kwargs) -> Results:
    """Run ``body(rk, *args, **kwargs)`` for each of ``world_size`` ranks; return the W results
    (a :class:`Results`, which also carries the run's ``loopback_bytes``).

    ``impl`` is the ``impl`` fixture (the implementation under test). ``timeout``:
    seconds for the whole run. Raises ``RankError`` (a rank raised or died) or
    ``RankTimeout`` (the run took longer than ``timeout``); both are
    ``AssertionError``s, so a test fails with the message. ``ValueError`` for
    ``world_size < 1``. An infrastructure failure (the sandbox could not start)
    propagates as ``harness.sandbox.SandboxStartError``.

    ``clean=True`` runs the body on twin ranks that never import the implementation (an empty
    module: ``rk.impl`` has nothing), for trusted work that must not share a process with the
    submission, e.g. a baseline timed where no submission code could slow it. Any failure there is
    the infrastructure's, never the submission's: it raises ``SandboxStartError``.
    """
    __tracebackhide__ = True
    if clean:
        try:
            return _run(body, world_size, *args, impl=impl, timeout=timeout, device=device, clean=True, **kwargs)
        except (RankError, RankTimeout) as e:
            raise SandboxStartError(f"the trusted twin ranks (no submission code) failed: {e}"[:4000]) from None
    return _run(body, world_size, *args, impl=impl, timeout=timeout, device=device, clean=False, **kwargs)


def _run(body: Callable, world_size: int, *args, impl, timeout: float, device: str, clean: bool,
         **kwargs) -> Results:
    __tracebackhide__ = True  # pytest shows the ranks' message, not this function
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not callable(body):
        raise ValueError(f"body must be a function, got {body!r}")
    backend = choose_backend(device, world_size)
    group = _group_for(impl, world_size, clean)
    sb = group.sandbox
    sb.failed = None
    sb.cfg.call_timeout_s = timeout
    try:
        sb.ensure()
    except (WorkerTimeout, WorkerCrashed) as e:
        raise RankError(f"W={world_size}: the ranks could not start: {e}") from None
    sb.failed = None
    sb.begin_test()
    proxies = [RankProxy(group, r, world_size, device, backend) for r in range(world_size)]
    pg_timeout = max(1.0, timeout * HARD_CAP)  # the run's watch stops a deadlock; gloo must not stop a slow peer
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    done = threading.Event()

    def drive(rk: RankProxy):
        try:
            _sb.run_probe("init_pg", on=rk.impl, rank=rk.rank, world_size=world_size, backend=backend,
                          port=port, timeout_s=pg_timeout, what=f"rank {rk.rank}: joining the group")
            rk.note("running the test body")
            value = body(rk, *args, **kwargs)
            _sb.run_probe("destroy_pg", on=rk.impl, what=f"rank {rk.rank}: leaving the group")
            results[rk.rank] = value
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[rk.rank] = e
            done.set()

    try:  # the run's store, served by rank 0 (the ranks share no file system)
        port = _sb.run_probe("store", on=proxies[0].impl, world_size=world_size, timeout_s=pg_timeout,
                             what="rank 0: serving the group's store")[0]
    except (WorkerTimeout, WorkerCrashed) as e:
        raise RankError(f"W={world_size}: rank 0 could not serve the group's store: {e}") from None
    threads = [threading.Thread(target=drive, args=(rk,), daemon=True, name=f"labs-rank{rk.rank}")
               for rk in proxies]
    namespaced = bool(isolation.isolation_prefix())
    wire_pid = sb.worker.pid_of_server(0) if namespaced else None
    wire0, retrans0 = loopback_tx_bytes(wire_pid), tcp_retransmits(wire_pid)
    start = time.monotonic()
    for t in threads:
        t.start()
    watch = sb.worker.watch(0, timeout)  # a deadlock waits; ranks computing on a loaded machine do not
    deadline, next_check = watch.deadline, start + 0.25
    for t in threads:
        while t.is_alive():
            now = time.monotonic()
            limit = deadline if not done.is_set() else min(deadline, first_error_at(done, start))
            if now >= limit:
                break
            if now >= next_check:
                next_check = now + 0.25
                try:
                    watch.check()
                except TimeoutError:
                    break
            t.join(timeout=min(0.05, max(0.0, limit - now)))
        if t.is_alive():
            break
    elapsed = time.monotonic() - start
    hung = [rk for rk, t in zip(proxies, threads) if t.is_alive()]
    notes = {rk.rank: _rank_note(sb, rk) for rk in proxies}
    if hung or errors:
        _recover(sb, proxies, threads, hung, errors)
    if not hung and not errors:
        out = Results(results[r] for r in range(world_size))
        wire1 = loopback_tx_bytes(wire_pid)
        out.loopback_bytes = None if wire0 is None or wire1 is None else wire1 - wire0
        retrans1 = tcp_retransmits(wire_pid)
        out.tcp_retransmits = None if retrans0 is None or retrans1 is None else retrans1 - retrans0
        return out
    texts = {r: _describe(e) for r, e in errors.items()}
    primary = [r for r, e in errors.items() if not isinstance(e, WorkerTimeout)
               and not any(k in texts[r] for k in _SECONDARY)]
    timed_out = not primary and (bool(hung) or any(isinstance(e, WorkerTimeout) or _GLOO_TIMEOUT in texts[r]
                                                   for r, e in errors.items()))
    if timed_out:
        sb.budget.timeouts += 1
        lines = [f"timed out after {elapsed:.1f}s (limit {timeout:g}s) with W={world_size}: a deadlock? (e.g. "
                 "neighbours that both start with a blocking send wait forever for each other); where each rank "
                 "waited:"]
        for r in range(world_size):
            lines.append(f"  rank {r}: {notes[r] or 'no note'}")
        tail = sb.worker.output_tail(600) if sb.worker is not None else ""
        raise RankTimeout("\n".join(lines)[:12000] + (f"\n--- output ---\n{tail}" if tail else ""))
    if any(isinstance(errors.get(r), WorkerCrashed) for r in primary):
        sb.budget.crashes += 1
    msgs = []
    for r in sorted(errors, key=lambda r: (any(k in texts[r] for k in _SECONDARY), r)):
        e = errors[r]
        if isinstance(e, WorkerCrashed):
            msgs.append(f"rank {r} of {world_size} died: {texts[r]} (last note: {notes[r]!r})")
        else:
            msgs.append(f"rank {r} of {world_size} raised {texts[r]}")
    for r in range(world_size):
        if r not in errors and r not in results:
            msgs.append(f"rank {r} of {world_size} did not finish (last note: {notes[r]!r})")
    raise RankError("\n\n".join(msgs)[:12000])


def _recover(sb: Sandbox, proxies: list, threads: list, hung: list, errors: dict) -> None:
    """After a failed run: when every rank answered (each returned or raised an error of the
    submission's), leave its process group and keep the ranks; otherwise kill them all."""
    healthy = not hung and sb.failed is None and not any(isinstance(e, SandboxError) for e in errors.values())
    if healthy:
        try:
            for rk in proxies:
                _sb.run_probe("destroy_pg", on=rk.impl, timeout=10, what=f"rank {rk.rank}: leaving the group")
            return
        except BaseException:  # noqa: BLE001 - then start afresh
            pass
    w = sb.worker
    if w is not None:
        w.terminate()
    for t in threads:
        t.join(timeout=10)
    sb.kill()


def first_error_at(done: threading.Event, start: float) -> float:
    """When the grace period after the first failure ends (recorded once)."""
    at = getattr(done, "_labs_at", None)
    if at is None:
        at = time.monotonic()
        done._labs_at = at
    return at + ERROR_GRACE_S


def _rank_note(sb: Sandbox, rk: RankProxy) -> str:
    w = sb.worker
    note = w.channels[rk.rank].read_note() if w is not None and rk.rank < len(w.channels) else ""
    return note or rk.last_note


def _describe(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    for n in getattr(e, "__notes__", []) or []:
        text += "\n" + str(n)
    return text[-5000:]
