"""The untrusted side: a launcher that isolates itself, then W servers that import one submission.

Forked for ``harness.sandbox.worker.Worker`` by the zygote (``harness.sandbox.zygote``: a
warm ``python -I`` that has imported torch) into the worker's cgroup and, where the host
allows, its own network, pid, IPC, UTS, cgroup and mount namespaces, in an empty temporary
directory, with a scrubbed environment (no seed, no ``LABS_*``). Its first frame, ``init``, arrives on stdin (the control socket).
Then, still harness code:

1. :func:`harness.sandbox.isolation.isolate`: private loopback, the allow-list root,
   resource limits; the launcher adopts every orphan of the worker;
2. fds 0-2: stdin reads ``/dev/null``, stdout and stderr go to the log the grader
   reads on a crash; torch, the probes and their stand-ins are imported and installed;
3. one process is forked per channel (one for a single-process lab, W for the ranks of
   a multi-rank lab: they share the private loopback, and nothing else: each gets its own
   ``/tmp``, ``/dev/shm`` and System V IPC, then the grading's uid,
   :func:`harness.sandbox.isolation.isolate_server`); each writes the submitted source
   (sent in the frame) to ``/tmp/work/impl/<module>.py``, says ``forked`` and waits until
   the grader has moved it into its own cgroup, makes its memory its own
   (:func:`harness.sandbox.isolation.private_memory`), imports the submission by path,
   answers ``ready`` on its channel and serves requests until ``exit`` or EOF;
4. the launcher drops its own powers too and stays behind to hold the namespaces; when
   the grader closes the control socket it kills the servers and exits.

Every answer is a plain value (see ``harness.sandbox.wire``) or a handle id; nothing a
server says is trusted beyond being a value to check.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import traceback

from .. import impl as _impl
from . import isolation, probes, triton_launches, wire


class Server:
    """One request loop next to the implementation module."""

    def __init__(self, reader: wire.Reader, fd_out: int, module, missing: dict | None = None):
        self.reader = reader
        self.fd_out = fd_out
        self.module = module
        self.missing = dict(missing or {})  # contract names the module lacks: using one fails that test
        self.handles: dict[int, object] = {}
        self.ids: dict[int, int] = {}       # id(obj) -> handle
        self.pinned: set[int] = set()
        self.next_id = 1

    # handles
    def ref_of(self, obj, pinned=False):
        key = id(obj)
        rid = self.ids.get(key)
        if rid is None or self.handles.get(rid) is not obj:
            rid = self.next_id
            self.next_id += 1
            self.handles[rid] = obj
            self.ids[key] = rid
        if pinned:
            self.pinned.add(rid)
        cls = type(obj)
        mro = [f"{c.__module__}.{c.__qualname__}" for c in getattr(cls, "__mro__", ())]
        return {"t": "ref", "id": rid, "type": f"{cls.__module__}.{cls.__qualname__}", "mro": mro,
                "callable": callable(obj), "pinned": rid in self.pinned}

    def resolve(self, tree):
        rid = tree.get("id")
        if rid == 0:
            return self.module
        if rid not in self.handles:
            raise LookupError(f"stale handle {rid}")
        return self.handles[rid]

    def dec(self, header, key, buffers):
        return wire.decode(header.get(key), buffers, self.resolve)

    def reply(self, value=None, extra=None, pinned=False, as_handle=False):
        buffers: list = []
        tree = self.ref_of(value, pinned) if as_handle else \
            wire.encode(value, buffers, lambda o: self.ref_of(o, pinned))
        wire.write_frame(self.fd_out, {"ok": True, "value": tree, "extra": extra or {}}, buffers)

    def error(self, e: BaseException):
        builtin = next((c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins"), "RuntimeError")
        frames = traceback.extract_tb(e.__traceback__)
        own = {__file__, wire.__file__, *(m.__file__ for m in probes.FAMILIES)}
        while frames and frames[0].filename in own:  # the server's own frames
            frames = traceback.StackSummary.from_list(frames[1:])
        tb = _traceback(frames, getattr(self.module, "__file__", None))[-2500:] + \
            "".join(traceback.format_exception_only(type(e), e))[:500]
        try:
            msg = str(e)
        except BaseException:
            msg = "<unprintable>"
        wire.write_frame(self.fd_out, {"ok": False, "error": {"type": type(e).__name__, "builtin": builtin,
                                                               "msg": msg[:8000], "tb": tb[-3000:],
                                                               "api": isinstance(e, _impl.APIMismatch)}})

    # requests
    def serve(self):
        while True:
            try:
                header, buffers = self.reader.read_frame()
            except EOFError:
                return
            op = header.get("op")
            if op == "exit":
                return
            try:
                handler = getattr(self, "op_" + str(op), None)
                if handler is None:
                    raise ValueError(f"unknown op {op!r}")
                handler(header, buffers)
            except BaseException as e:  # SystemExit and KeyboardInterrupt from a submission included
                try:
                    self.error(e)
                except BaseException:
                    os._exit(70)
            finally:
                wire.VIEW_BASES.clear()

    def op_reset(self, h, b):
        self.handles = {k: v for k, v in self.handles.items() if k in self.pinned}
        self.ids = {id(v): k for k, v in self.handles.items()}
        self.reply(None)

    def op_getattr(self, h, b):
        name = self.dec(h, "name", b)
        if h.get("module"):
            if name in self.missing:
                raise _impl.APIMismatch(self.missing[name])
            self.reply(getattr(self.module, name), pinned=True)
        else:
            self.reply(getattr(self.dec(h, "target", b), name))

    def op_setattr(self, h, b):
        setattr(self.dec(h, "target", b), self.dec(h, "name", b), self.dec(h, "value", b))
        self.reply(None)

    def op_call(self, h, b):
        fn, args, kwargs = self.dec(h, "target", b), self.dec(h, "args", b), self.dec(h, "kwargs", b)
        probes.common.check_call(fn, args, kwargs)
        self.reply(fn(*args, **kwargs))

    def op_getitem(self, h, b):
        self.reply(self.dec(h, "target", b)[self.dec(h, "key", b)])

    def op_len(self, h, b):
        self.reply(int(len(self.dec(h, "target", b))))

    def op_iter(self, h, b):
        items = []
        for i, x in enumerate(self.dec(h, "target", b)):
            if i >= 100000:
                raise ValueError("more than 100000 items")
            items.append(x)
        self.reply(items)

    def op_probe(self, h, b):
        fn = probes.PROBES.get(str(h.get("name")))
        if fn is None:
            raise ValueError(f"unknown probe {h.get('name')!r}")
        keys = h.get("keys", [])
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ValueError("bad probe keys")
        values = {k: self.dec(h, "v_" + k, b) for k in keys}
        value, figures = fn(self.module, **values)
        self.reply(value, {k: v for k, v in figures.items() if k != "keep"}, as_handle=bool(figures.get("keep")))


def _traceback(frames, mine: str | None) -> str:
    """The frames a student reads: every frame in their own module (the last 6: file and line of
    their code, however deep torch's frames below them go) and the last 4, in order, with a
    ``...`` where frames are left out."""
    keep = {i for i, f in enumerate(frames) if f.filename == mine}
    keep = set(sorted(keep)[-6:]) | set(range(max(0, len(frames) - 4), len(frames)))
    out, last = [], -1
    for i in sorted(keep):
        if i != last + 1:
            out.append("  ...\n")
        out += traceback.format_list([frames[i]])
        last = i
    return "".join(out)


def _note_writer(fd: int):
    def write(msg: str) -> None:
        data = msg.encode("utf-8", "replace")[:399]
        try:
            os.pwrite(fd, data + b"\0" * (400 - len(data)), 0)
        except OSError:
            pass
    return write


def _serve_rank(header: dict, channel: list, contract) -> None:
    """In a forked child: isolate it (its own /tmp and IPC, the grading's uid), wait until the
    grader has put it in its cgroup, make its memory its own, import the submission, say ready
    on ``channel``, serve."""
    fd_in, fd_out, fd_note = channel
    probes.common.note = _note_writer(fd_note)
    try:
        work = isolation.isolate_server(header)
        src_path = os.path.join(work, "impl", header["module_filename"])
        os.makedirs(os.path.dirname(src_path), exist_ok=True)
        with open(src_path, "w") as f:
            f.write(header["module_source"])
    except BaseException as e:  # noqa: BLE001 - before any student code: an infrastructure failure
        wire.write_frame(fd_out, {"ok": False, "infra": f"{type(e).__name__}: {e}"[:4000]})
        return
    reader = wire.Reader(fd_in)
    wire.write_frame(fd_out, {"forked": os.getpid()})  # the grader moves this process into its cgroup...
    if reader.read_frame()[0].get("op") != "go":  # ... then says go
        return
    wire.write_frame(fd_out, {"private": isolation.private_memory()})  # the grader reads where we start...
    if reader.read_frame()[0].get("op") != "import":  # ... then says import
        return
    try:
        mod = _impl.load_module(src_path)
    except _impl.ImplError as e:
        wire.write_frame(fd_out, {"ok": False, "error": str(e), "student": True})
        return
    except BaseException as e:  # noqa: BLE001 - whatever the import raised is the student's
        wire.write_frame(fd_out, {"ok": False, "error": f"importing {os.path.basename(src_path)} raised "
                                                        f"{type(e).__name__}: {e}"[:4000], "student": True})
        return

    class _Lab:
        number = str(header.get("lab", ""))
        api = list(header.get("api", []))
    probes.common.API.update(module=mod.__name__, contract=contract)
    wire.write_frame(fd_out, {"ok": True})
    Server(reader, fd_out, mod, _impl.missing_names(mod, _Lab)).serve()


def _hold(fd_ctl: int, note_of: dict) -> None:
    """Hold the namespaces until the grader closes the control channel; write each server's
    exit status into the second slot of its note file (the grader is not its parent)."""
    import select
    while True:
        try:
            r, _, _ = select.select([fd_ctl], [], [], 0.05)
            if r and not os.read(fd_ctl, 4096):
                return
        except OSError:
            return
        while note_of:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            fd = note_of.pop(pid, None)
            if fd is not None:
                code = os.waitstatus_to_exitcode(status)
                with contextlib.suppress(OSError):
                    os.pwrite(fd, f"exit {code}".encode().ljust(32, b"\0"), 400)


def main():
    import socket
    fd_ctl = os.dup(0)
    fd_ctl_out = fd_ctl
    reader = wire.Reader(fd_ctl)
    header, _ = reader.read_frame()
    try:
        ctl = socket.socket(fileno=os.dup(fd_ctl))
        _, fds, _, _ = socket.recv_fds(ctl, 1, 3 * int(header.get("servers", 1)))
        ctl.close()
        channels = [fds[i:i + 3] for i in range(0, len(fds), 3)]
        notes = isolation.isolate(header)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(2, 1)
        os.close(devnull)
        sys.stdin = open(os.devnull)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # ranks meet on the private loopback
        # one malloc arena (M_ARENA_MAX = 1): memory freed by any thread (gloo's, torch's) reaches
        # malloc_trim, so the resident memory the grader reads is live memory, not a stale arena
        ctypes.CDLL(None).mallopt(-8, 1)
        import torch  # noqa: F401  (before the submission: its import time is not the student's)
        probes.preload()  # the probes' own imports: neither the student's time nor their memory
        triton_launches.install()  # before the submission decorates a kernel (a no-op without Triton)
        if int(header.get("servers", 1)) > 1 or header.get("ranks"):
            import importlib
            for name in ("torch.distributed", "torch._dynamo"):  # the optimizer imports dynamo: seconds per rank
                importlib.import_module(name)
            probes.comm.install_comm_hooks()  # before the submission can save a reference to anything it wraps
        probes.guards.install_guards()  # likewise: the dispatch-stack bindings and the measurements' own methods
        contract = None
        if header.get("stub_source") is not None:  # the launcher's own scratch: no server sees the file
            scratch = os.path.join("/run" if header.get("namespaces") else header["workdir"], "contract")
            os.makedirs(scratch, exist_ok=True)
            stub = os.path.join(scratch, header["module_filename"])
            with open(stub, "w") as f:
                f.write(header["stub_source"])
            contract = _impl.load_module(stub)
    except BaseException as e:  # noqa: BLE001 - before any student code: an infrastructure failure
        wire.write_frame(fd_ctl_out, {"ok": False, "error": f"the sandbox could not start: "
                                                            f"{type(e).__name__}: {e}"[:4000]})
        return
    pids = []
    for i, channel in enumerate(channels):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 0
            try:
                for j, other in enumerate(channels):
                    if j != i:
                        for fd in other:
                            os.close(fd)
                os.close(fd_ctl)
                _serve_rank(header, channel, contract)
            except BaseException:  # noqa: BLE001
                code = 70
            finally:
                os._exit(code)
        pids.append(pid)
    for channel in channels:
        for fd in channel[:2]:
            os.close(fd)
    try:
        isolation.drop(header)  # the launcher runs no student code, and holds no power either
    except BaseException as e:  # noqa: BLE001
        wire.write_frame(fd_ctl_out, {"ok": False, "error": f"the sandbox could not start: {e}"[:4000]})
        return
    wire.write_frame(fd_ctl_out, {"ok": True, "notes": notes, "servers": len(pids)})
    _hold(fd_ctl, {pid: ch[2] for pid, ch in zip(pids, channels)})
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main()
