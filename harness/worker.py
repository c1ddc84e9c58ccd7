"""The untrusted side: a process that imports one submission and answers the grader.

Started by ``harness.sandbox.Worker`` as ``python -I -c "from harness.worker import
main; main()"`` (behind ``unshare --net --pid --mount`` where the host allows),
in an empty temporary directory, with a scrubbed environment (no seed, no
``LABS_*``). Its first frame, ``init``, arrives on stdin; before the submission
is imported this process (still harness code):

1. hides paths: an empty tmpfs over the course's ``graders/``, ``solutions/``,
   ``tests/`` and the grading work directory, and fresh tmpfs over ``/tmp``,
   ``/var/tmp`` and ``/dev/shm`` (mount namespace only; inside a container the
   image's permissions do it: those paths are root-only);
2. sets resource limits: address space (CPU-only runs), CPU seconds, processes,
   file size, core dumps;
3. drops to an unprivileged user when started as root (``student``, else
   ``nobody``; groups cleared, ``no_new_privs``), then asks for SIGKILL when the
   grader dies;
4. moves the protocol to private file descriptors: fd 0 reads ``/dev/null`` and
   fds 1, 2 go to the log the grader reads on a crash;
5. writes the submitted source (sent in the frame, so the staged file needs no
   access) to ``impl/<module>.py`` and imports it by path, then checks it against
   the stub's names and signatures.

Then it serves requests until ``exit`` or EOF. Every answer is a plain value
(see ``harness.sandbox`` for the format) or a handle id; nothing this process
says is trusted beyond being a value to check.
"""
from __future__ import annotations

import ctypes
import os
import resource
import sys
import traceback

MS_NOSUID, MS_NODEV, MS_RDONLY = 2, 4, 1
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def _mount_tmpfs(path: str, mode: str = "0755", size: str = "512m") -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if not os.path.isdir(path):
        return False
    rc = libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                    f"mode={mode},size={size}".encode())
    return rc == 0


def _untraversable(path: str) -> tuple[str, str] | None:
    """(A, child): the first ancestor A of ``path`` that others cannot traverse (e.g. a
    0700 /root holding pyenv's Python), and the next component on the way to ``path``."""
    import stat
    parts = os.path.abspath(path).split(os.sep)[1:]
    cur = "/"
    for name in parts:
        st = os.stat(cur)
        if not st.st_mode & stat.S_IXOTH:
            return cur, name
        cur = os.path.join(cur, name)
    return None


def _expose_through(path: str) -> bool:
    """In the mount namespace, replace an untraversable ancestor of ``path`` by an empty
    tmpfs that holds only the way to ``path`` (bind-mounted), so an unprivileged user
    reaches the interpreter and nothing else that was there."""
    libc = ctypes.CDLL(None, use_errno=True)
    MS_BIND, MS_REC = 4096, 16384
    while True:
        found = _untraversable(path)
        if found is None:
            return True
        parent, child = found
        fd = os.open(os.path.join(parent, child), os.O_PATH)
        if not _mount_tmpfs(parent, "0755", "1m"):
            return False
        target = os.path.join(parent, child)
        os.mkdir(target)
        if libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None) != 0:
            return False
        os.close(fd)


def _fresh_tmpfs_keeping(path: str, keep: list[str]) -> bool:
    """Mount an empty, world-writable tmpfs over ``path`` but bind-mount back the
    directories of ``keep`` that lie under it (with their own submounts, so hidden
    paths stay hidden): a course checked out under /tmp keeps its interpreter,
    packages and harness, and loses everything else there."""
    libc = ctypes.CDLL(None, use_errno=True)
    MS_BIND, MS_REC = 4096, 16384
    under = sorted({k for k in keep if os.path.commonpath([path, os.path.abspath(k)]) == path and k != path},
                   key=len)
    under = [k for i, k in enumerate(under) if not any(k.startswith(u + os.sep) for u in under[:i])]
    fds = [(k, os.open(k, os.O_PATH)) for k in under if os.path.isdir(k)]
    if not _mount_tmpfs(path, "1777"):
        return False
    ok = True
    for k, fd in fds:
        os.makedirs(k, exist_ok=True)
        ok &= libc.mount(f"/proc/self/fd/{fd}".encode(), k.encode(), None, MS_BIND | MS_REC, None) == 0
        os.close(fd)
    return ok


def _isolate(cfg: dict) -> list[str]:
    notes = []
    import torch
    needed = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(torch.__file__)),
              cfg.get("harness_parent", "/")]
    if cfg.get("namespaces") and cfg.get("uid") is not None:
        for p in set(needed):
            if not _expose_through(p):
                notes.append(f"could not expose {p}")
    if cfg.get("namespaces"):
        for p in cfg.get("hide", []):
            if not _mount_tmpfs(p, "0555", "1m"):
                notes.append(f"could not hide {p}")
        for p in ("/tmp", "/var/tmp", "/dev/shm"):
            if not _fresh_tmpfs_keeping(p, [os.path.realpath(n) for n in needed]):
                notes.append(f"could not replace {p}")
        work = "/tmp/work"
        os.makedirs(work, exist_ok=True)
        if cfg.get("uid") is not None:
            os.chown(work, cfg["uid"], cfg["gid"])
        os.chdir(work)
        os.environ.update(HOME=work, TMPDIR=work, TRITON_CACHE_DIR=os.path.join(work, ".triton"),
                          TORCHINDUCTOR_CACHE_DIR=os.path.join(work, ".inductor"), MPLCONFIGDIR=work)
    mem = int(cfg.get("memory_mb", 0)) << 20
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 256 << 20),
              (resource.RLIMIT_CPU, int(cfg.get("cpu_s", 3600))), (resource.RLIMIT_NPROC, int(cfg.get("nproc", 512)))]
    if mem and not cfg.get("cuda"):  # CUDA reserves huge virtual ranges: RLIMIT_AS would break it
        limits.append((resource.RLIMIT_AS, mem + (2 << 30)))  # + the interpreter's and libraries' mappings
    for what, value in limits:
        try:
            soft, hard = resource.getrlimit(what)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError):
            notes.append(f"rlimit {what} not set")
    libc = ctypes.CDLL(None, use_errno=True)
    if cfg.get("uid") is not None and not cfg.get("namespaces") and _untraversable(sys.base_prefix):
        notes.append(f"not dropping to {cfg.get('user')}: it cannot reach {sys.base_prefix}")
        cfg["uid"] = None
    if cfg.get("uid") is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # after setuid, which clears it
    if os.getppid() == 1 and not cfg.get("namespaces"):
        os._exit(3)  # the grader is already gone
    return notes


class Server:
    def __init__(self, fd_in: int, fd_out: int):
        from harness import sandbox
        self.sb = sandbox
        self.reader = sandbox._Reader(fd_in)
        self.fd_out = fd_out
        self.handles: dict[int, object] = {}
        self.ids: dict[int, int] = {}       # id(obj) -> handle
        self.pinned: set[int] = set()
        self.next_id = 1
        self.module = None

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
        return self.sb.decode(header.get(key), buffers, self.resolve)

    def reply(self, value=None, extra=None, pinned=False):
        buffers: list = []
        tree = self.sb.encode(value, buffers, lambda o: self.ref_of(o, pinned))
        self.sb.write_frame(self.fd_out, {"ok": True, "value": tree, "extra": extra or {}}, buffers)

    def error(self, e: BaseException):
        builtin = next((c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins"), "RuntimeError")
        frames = traceback.extract_tb(e.__traceback__)
        while frames and frames[0].filename in (__file__, self.sb.__file__):  # the worker's own frames
            frames = traceback.StackSummary.from_list(frames[1:])
        tb = "".join(traceback.format_list(frames[-10:]) + traceback.format_exception_only(type(e), e))
        try:
            msg = str(e)
        except BaseException:
            msg = "<unprintable>"
        self.sb.write_frame(self.fd_out, {"ok": False, "error": {"type": type(e).__name__, "builtin": builtin,
                                                                  "msg": msg[:8000], "tb": tb[-3000:]}})

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

    def op_reset(self, h, b):
        self.handles = {k: v for k, v in self.handles.items() if k in self.pinned}
        self.ids = {id(v): k for k, v in self.handles.items()}
        self.reply(None)

    def op_getattr(self, h, b):
        name = self.dec(h, "name", b)
        if h.get("module"):
            self.reply(getattr(self.module, name), pinned=True)
        else:
            self.reply(getattr(self.dec(h, "target", b), name))

    def op_setattr(self, h, b):
        setattr(self.dec(h, "target", b), self.dec(h, "name", b), self.dec(h, "value", b))
        self.reply(None)

    def op_call(self, h, b):
        fn, args, kwargs = self.dec(h, "target", b), self.dec(h, "args", b), self.dec(h, "kwargs", b)
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

    def _forbid(self, names, reason, seen):
        import contextlib
        import importlib
        stack = contextlib.ExitStack()
        patches = []
        for target in names:
            mod_name, attr = target.rsplit(".", 1)
            home = importlib.import_module(mod_name)
            original = getattr(home, attr)

            def forbidden(*a, _t=target, **k):
                seen.append(_t)
                raise AssertionError(f"called {_t}: {reason}")
            patches.append((home, attr, original, forbidden))
            for name, value in list(vars(self.module).items()):
                if value is original:
                    patches.append((self.module, name, original, forbidden))
        for obj, attr, _, new in patches:
            setattr(obj, attr, new)

        def restore():
            for obj, attr, old, _ in reversed(patches):
                setattr(obj, attr, old)
        stack.callback(restore)
        return stack

    def _tracked(self, opts, seen):
        import contextlib
        import torch
        from harness.alloc import AllocationTracker
        stack = contextlib.ExitStack()
        stack.enter_context(self._forbid(opts.get("forbid", []), opts.get("reason", ""), seen))
        if opts.get("no_grad"):
            stack.enter_context(torch.no_grad())
        counter = None
        if opts.get("flops"):
            from torch.utils.flop_counter import FlopCounterMode
            counter = stack.enter_context(FlopCounterMode(display=False))
        tracker = None
        if opts.get("alloc", True) or opts.get("ops", True) or opts.get("nonfinite"):
            tracker = stack.enter_context(AllocationTracker(watch_nonfinite=bool(opts.get("nonfinite"))))
        return stack, tracker, counter

    @staticmethod
    def _figures(tracker, counter, seen):
        extra = {"forbidden": sorted(set(seen))}
        if tracker is not None:
            extra.update(max_numel=tracker.max_numel, max_bytes=tracker.max_bytes, total_bytes=tracker.total_bytes,
                         largest=tracker.largest, ops=sorted(tracker.ops), nonfinite=tracker.first_nonfinite)
        if counter is not None:
            extra["flops"] = int(counter.get_total_flops())
        return extra

    def op_measure(self, h, b):
        opts = h.get("opts", {})
        fn, args, kwargs = self.dec(h, "target", b), self.dec(h, "args", b), self.dec(h, "kwargs", b)
        seen: list = []
        stack, tracker, counter = self._tracked(opts, seen)
        with stack:
            out = fn(*args, **kwargs)
        self.reply(out, self._figures(tracker, counter, seen))

    def _leaves(self, args, rg):
        import torch
        out = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                a = a.detach()
                if i < len(rg) and rg[i]:
                    a.requires_grad_(True)
            out.append(a)
        return out

    def op_vjp(self, h, b):
        import torch
        from harness.alloc import AllocationTracker
        from harness.sandbox import _detach_tree, _flat
        opts = h.get("opts", {})
        fn, args, kwargs = self.dec(h, "target", b), self.dec(h, "args", b), self.dec(h, "kwargs", b)
        gouts = self.dec(h, "grad_outputs", b)
        leaves = self._leaves(args, opts.get("requires_grad", []))
        seen: list = []
        extra = {}
        with self._forbid(opts.get("forbid", []), opts.get("reason", ""), seen):
            out = fn(*leaves, **kwargs)
            outs = [t for t in _flat(out) if isinstance(t, torch.Tensor)]
            g = [x for x in _flat(gouts) if isinstance(x, torch.Tensor)] if gouts is not None else None
            pairs = [(o, gg) for o, gg in zip(outs, g or [None] * len(outs)) if o.requires_grad]
            if not pairs:
                raise AssertionError("the output does not require grad: no autograd graph reaches the inputs "
                                     "(detached, computed under no_grad, or not built from them)")
            tracker = AllocationTracker() if opts.get("measure_backward") else None
            if tracker is not None:
                with tracker:
                    torch.autograd.backward([o for o, _ in pairs], [x for _, x in pairs] if g is not None else None)
                extra = self._figures(tracker, None, seen)
            else:
                torch.autograd.backward([o for o, _ in pairs], [x for _, x in pairs] if g is not None else None)
        grads = tuple(a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None for a in leaves)
        extra["forbidden"] = sorted(set(seen))
        self.reply((_detach_tree(out), grads), extra)

    def op_helper(self, h, b):
        from harness.sandbox import HELPERS
        fn = HELPERS[str(h.get("name"))]
        self.reply(fn(self.dec(h, "target", b), *self.dec(h, "args", b)))

    def op_param_grads(self, h, b):
        m = self.dec(h, "target", b)
        self.reply({n: (None if p.grad is None else p.grad.detach()) for n, p in m.named_parameters()})

    def op_saved_tensors(self, h, b):
        opts = h.get("opts", {})
        fn, args, kwargs = self.dec(h, "target", b), self.dec(h, "args", b), self.dec(h, "kwargs", b)
        out = fn(*self._leaves(args, opts.get("requires_grad", [])), **kwargs)
        saved = list(getattr(getattr(out, "grad_fn", None), "saved_tensors", ()) or ())
        self.reply((out.detach() if hasattr(out, "detach") else out, [t.detach() for t in saved]))


def main():
    from harness import sandbox
    fd_in, fd_out = os.dup(0), os.dup(1)
    reader = sandbox._Reader(fd_in)
    header, _ = reader.read_frame()
    notes = _isolate(header)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    sys.stdin = open(os.devnull)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    server = Server(fd_in, fd_out)
    server.reader = reader
    try:
        import torch  # noqa: F401  (before the submission: its import time is not the student's)
        from harness import impl as _impl
        os.makedirs("impl", exist_ok=True)
        path = os.path.abspath(os.path.join("impl", header["module_filename"]))
        with open(path, "w") as f:
            f.write(header["module_source"])
        contract = None
        if header.get("stub_source") is not None:
            os.makedirs("contract", exist_ok=True)
            stub = os.path.abspath(os.path.join("contract", header["module_filename"]))
            with open(stub, "w") as f:
                f.write(header["stub_source"])
            contract = _impl.load_module(stub)
        try:
            mod = _impl.load_module(path)
        except _impl.ImplError as e:
            sandbox.write_frame(fd_out, {"ok": False, "error": str(e)})
            return
        server.module = mod

        class _Lab:
            api = list(header.get("api", []))
        problems = _impl.check_api(mod, contract, _Lab)
    except BaseException as e:
        sandbox.write_frame(fd_out, {"ok": False, "error": f"the sandbox could not start: {type(e).__name__}: {e}"})
        return
    sandbox.write_frame(fd_out, {"ok": True, "problems": problems, "notes": notes})
    server.serve()


if __name__ == "__main__":
    main()
