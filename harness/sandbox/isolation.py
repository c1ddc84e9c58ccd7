"""Isolation of the sandboxed worker: namespaces, the file-system view, limits, the user.

Two halves. The trusted side decides how the worker starts:

* :func:`isolation_prefix`: behind ``unshare --net --pid --mount`` where the host
  allows (root, or an unprivileged user namespace);
* :func:`worker_uid`: when the grader is root, a uid of its own for this grading
  (``UID_BASE`` + the grading process's pid, no passwd entry needed), so
  ``RLIMIT_NPROC`` and :func:`kill_all_of_uid` touch this grading's workers only;
* :func:`scrubbed_env`: a fixed environment (never the seed or ``LABS_*``);
* :func:`stage_harness`: copies the worker-facing harness modules
  (:func:`worker_files`, found from what ``server`` imports) into the worker's
  directory, the only harness the worker imports (never the trusted side of the
  sandbox, ``oracles``, ``testing``, ``grading`` or a front end);
* :func:`package_dirs`: the package directories the worker needs.

The worker side, :func:`isolate`, runs in ``harness.sandbox.server`` before the
submission is imported, while the process may still be root in its namespaces:

1. brings up the private network namespace's loopback (ranks of a multi-rank lab
   talk gloo over it; nothing else is reachable);
2. builds a fresh root, an allow-list (:func:`_build_root`): the system
   directories, the Python prefixes and package directories and the staged
   harness, all read-only; a minimal ``/dev``; a fresh ``/proc``; ``/sys`` only
   for CUDA; fresh tmpfs for ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run``.
   The course (``graders/``, ``solutions/``, ``tests/``, ``.git``), other
   submissions and the rest of the disk are not in it; a venv inside the course
   brings only itself, and no path that holds one of ``cfg["hide"]`` (the
   course's hidden folders, the staged submission) is ever bound. Then
   ``pivot_root`` into it (the old root is detached);
3. sets resource limits: address space (CPU-only runs), CPU seconds, processes,
   file size, core dumps;
4. drops to the grading's uid when started as root (groups cleared), or, still
   root in a user namespace, gives up every capability (it cannot remount or
   unmount its view); ``no_new_privs``; then asks for SIGKILL when its parent dies.

Without namespaces (no ``unshare``, or non-root without user namespaces) step 2
cannot be done: the worker sees the disk as its user may, and a note says so.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import itertools
import os
import platform
import re
import resource
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
from pathlib import Path
from ..errors import LabsError


# --- the trusted side ---------------------------------------------------------------------------

def isolation_prefix() -> list[str]:
    """``unshare`` prefix giving the worker no network and its own PID, IPC, UTS, cgroup and
    mount namespaces (so it cannot see or signal the grader, shares no System V object with
    the host or a later grading, and gets its own view of the disk), when this host allows it."""
    global _PREFIX
    if _PREFIX is not None:
        return _PREFIX
    _PREFIX = []
    exe = shutil.which("unshare")
    if exe and os.environ.get("LABS_SANDBOX_NO_NAMESPACES") != "1":
        base = [exe, "--net", "--pid", "--ipc", "--uts", "--cgroup", "--fork", "--kill-child", "--mount", "--mount-proc"]
        for cand in ([base] if os.geteuid() == 0 else [base + ["--user", "--map-root-user"]]):
            try:
                ok = subprocess.run(cand + ["true"], capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
            if ok:
                _PREFIX = cand
                break
    return _PREFIX


_PREFIX: list[str] | None = None
UID_BASE = 200000


def _mapped(ident: int, which: str) -> bool:
    """Whether ``ident`` exists in this user namespace (``/proc/self/uid_map``/``gid_map``)."""
    try:
        lines = Path(f"/proc/self/{which}_map").read_text().split("\n")
    except OSError:
        return True
    return any(len(f) == 3 and int(f[0]) <= ident < int(f[0]) + int(f[2]) for f in (ln.split() for ln in lines))


def worker_uid() -> tuple[int, int, str] | None:
    """(uid, gid, name) the workers drop to when the grader runs as root: ``UID_BASE`` +
    this process's pid (every worker of one grading process shares it, two gradings
    never do), else that modulo 100000, else ``student``/``nobody`` where the host maps
    no such ids; None when not root (cannot switch)."""
    if os.geteuid() != 0:
        return None
    import pwd
    pid = os.getpid()
    for uid in (UID_BASE + pid, UID_BASE + pid % 100000):
        if _mapped(uid, "uid") and _mapped(uid, "gid"):
            with contextlib.suppress(KeyError):
                pwd.getpwuid(uid)
                continue  # an account's uid: not ours to take
            return uid, uid, f"labs-{pid}"
    for name in ("student", "nobody"):
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid, name
        except KeyError:
            continue
    return None


def scrubbed_env(home: str) -> dict:
    """The worker's whole environment: a fixed allow-list, never the seed or LABS_* settings."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "TRITON_CACHE_DIR": os.path.join(home, ".triton"),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(home, ".inductor"), "MPLCONFIGDIR": home}
    for key in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


@functools.lru_cache(maxsize=None)
def worker_files(entry: str = "sandbox/zygote.py") -> tuple[str, ...]:
    """The harness files the worker side imports, relative to the ``harness`` package: ``entry``
    and every harness module it imports, transitively (module-level and function-level
    imports, absolute or relative), with the ``__init__.py`` of each package above them; a
    package imported as such brings every module in it (``probes`` finds its families by
    discovery). Nothing else of the harness reaches the worker: not the trusted side of the
    sandbox, the graders' oracles or helpers, grading, or a front end."""
    import ast
    root = Path(__file__).resolve().parent.parent

    def module_file(dotted: str) -> Path | None:  # harness.x.y -> its file, or None outside the harness
        parts = dotted.split(".")
        if parts[0] != "harness":
            return None
        base = root.joinpath(*parts[1:])
        for cand in (base / "__init__.py", base.with_suffix(".py")):
            if cand.is_file():
                return cand
        return None

    files: set[Path] = set()
    todo = [(root / entry, False)]  # (file, whether it was imported as a package)
    while todo:
        f, package = todo.pop()
        if package and f.parent != root:
            todo += [(p, False) for p in sorted(f.parent.glob("*.py")) if p not in files]
        if f in files:
            continue
        files.add(f)
        todo += [(root / d / "__init__.py", False) for d in f.relative_to(root).parents
                 if (root / d / "__init__.py").is_file()]
        pkg = ["harness", *f.relative_to(root).parent.parts]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):  # import a.b: the module (a package: all of it)
                named, container = [a.name for a in node.names], None
            elif isinstance(node, ast.ImportFrom):  # from a import b: a's file, and b where b is a module
                base = ".".join(pkg[:len(pkg) - node.level + 1]) if node.level else ""
                container = ".".join(x for x in (base, node.module or "") if x)
                named = [f"{container}.{a.name}" for a in node.names]
            else:
                continue
            todo += [(m, m.name == "__init__.py") for m in map(module_file, named) if m is not None]
            if container and module_file(container) is not None:
                todo.append((module_file(container), False))
    return tuple(sorted(p.relative_to(root).as_posix() for p in files))


def stage_harness(workdir: str) -> str:
    """Copy :func:`worker_files` from this process's harness into ``workdir/lib/harness``
    (readable by the worker's user); returns ``workdir/lib``, which the worker puts
    first on ``sys.path``."""
    src = Path(__file__).resolve().parent.parent
    lib = os.path.join(workdir, "lib")
    for rel in worker_files():
        dest = os.path.join(lib, "harness", rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(src / rel, dest)
        os.chmod(dest, 0o644)
    for d, _, _ in os.walk(lib):
        os.chmod(d, 0o755)
    return lib



def grader_side_files() -> list[str]:
    """This process's harness modules that are not the worker's (``oracles``, ``testing``,
    ``grading``, the front ends): a worker without namespaces must not be able to read them."""
    top = Path(__file__).resolve().parent.parent
    keep = set(worker_files())
    return sorted(str(p) for p in top.rglob("*.py") if p.relative_to(top).as_posix() not in keep)


def package_dirs() -> list[str]:
    """This interpreter's package directories on ``sys.path`` (``site-packages``,
    ``dist-packages``, those a ``.pth`` file added included): the worker, started with
    ``-I``, cannot compute them the same way, and gets them read-only in its root."""
    return sorted({os.path.abspath(p) for p in sys.path
                   if p and os.path.basename(os.path.normpath(p)) in ("site-packages", "dist-packages")
                   and os.path.isdir(p)})


def kill_all_of_uid(uid: int) -> None:
    """kill(-1, SIGKILL) as ``uid``: every process of that (dedicated) user dies."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def remove_ipc_of_uid(uid: int) -> list[str]:
    """Remove every System V shared memory segment, message queue and semaphore set ``uid``
    owns or created in this IPC namespace (``/proc/sysvipc``; a worker without an IPC
    namespace of its own leaves them on the host otherwise); returns what was removed."""
    IPC_RMID = 0
    removed = []
    for kind, ident, rm in (("shm", "shmid", lambda i: _libc.shmctl(i, IPC_RMID, None)),
                            ("msg", "msqid", lambda i: _libc.msgctl(i, IPC_RMID, None)),
                            ("sem", "semid", lambda i: _libc.semctl(i, 0, IPC_RMID))):
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:
            continue
        head = lines[0].split() if lines else []
        for line in lines[1:]:
            row = dict(zip(head, line.split()))
            if str(uid) in (row.get("uid"), row.get("cuid")) and row.get(ident, "").isdigit():
                if rm(int(row[ident])) == 0:
                    removed.append(f"{kind} {row[ident]}")
    return removed


# --- the worker side ----------------------------------------------------------------------------

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME, MNT_DETACH = 1 << 21, 1 << 24, 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}.get(platform.machine())
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


class IsolationError(LabsError, RuntimeError):
    """The worker's root could not be built: it must not run (an infrastructure failure)."""


def _mount(src, target: str, fstype, flags: int, data=None) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s
    if _libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise IsolationError(f"mount {src} on {target}: {os.strerror(err)}")


def _tmpfs(target: str, mode: str, size: str = "512m") -> None:
    os.makedirs(target, exist_ok=True)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={size}")


def _mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path`` (``/proc/self/mountinfo``, octal escapes decoded)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if mp == path or mp.startswith(path.rstrip("/") + "/"):
            out.append(mp)
    return out


def _kept_flags(path: str) -> int:
    """The mount flags of ``path`` a remount must keep (in a user namespace they are locked)."""
    f = os.statvfs(path).f_flag
    flags = sum(ms for st, ms in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                                  (os.ST_NODIRATIME, MS_NODIRATIME)) if f & st)
    return flags | (MS_NOATIME if f & os.ST_NOATIME else MS_RELATIME if f & os.ST_RELATIME else MS_STRICTATIME)


def _bind(src: str, target: str, readonly: bool = True) -> None:
    """Bind-mount ``src`` (a directory with its submounts, or a file) on ``target``, creating
    it; ``readonly``: every mount of the copy is made read-only and nosuid, nodev."""
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(src, target, None, MS_BIND | MS_REC)
    for mp in _mounts_under(os.path.realpath(target)) if readonly else ():
        _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | _kept_flags(mp))
    if readonly and not os.statvfs(target).f_flag & os.ST_RDONLY:
        raise IsolationError(f"{target} did not become read-only")


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _through_links(path: str) -> str:
    """``path`` as the new root resolves a leading linked system directory (merged /usr:
    ``/lib/x`` is ``/usr/lib/x``)."""
    for d in SYSTEM_DIRS:
        if os.path.islink(d) and _under(path, [d]):
            return os.path.normpath(os.path.join("/", os.readlink(d))) + path[len(d):]
    return path


def _build_root(cfg: dict) -> list[str]:
    """Step 2: the worker's root, an allow-list, entered with ``pivot_root``. Raises
    IsolationError when a needed part cannot be mounted; returns notes on optional parts."""
    notes = []
    os.umask(0o022)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    new = os.path.join(cfg["workdir"], "root")
    _tmpfs(new, "0755", "16m")
    at = lambda p: new + p
    for d in SYSTEM_DIRS:
        if os.path.islink(d):  # merged /usr: /bin -> usr/bin
            os.symlink(os.readlink(d), at(d))
        elif os.path.isdir(d):
            _bind(d, at(d))
    _tmpfs(at("/dev"), "0755", "1m")
    for name in DEVICES:
        _bind(f"/dev/{name}", at(f"/dev/{name}"), readonly=False)
    for node in sorted(glob.glob("/dev/nvidia*")):
        try:
            _bind(node, at(node), readonly=False)
        except IsolationError as e:
            notes.append(str(e))
    for name, fd in (("fd", ""), ("stdin", "/0"), ("stdout", "/1"), ("stderr", "/2")):
        os.symlink(f"/proc/self/fd{fd}", at(f"/dev/{name}"))
    _tmpfs(at("/dev/shm"), "1777")
    _mount(None, at("/dev"), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.makedirs(at("/proc"))
    try:  # the pid namespace is new: a fresh proc shows the worker's processes only
        _mount("proc", at("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except IsolationError:
        _bind("/proc", at("/proc"), readonly=False)  # unshare --mount-proc's, the same view
    if cfg.get("cuda") and os.path.isdir("/sys"):
        _bind("/sys", at("/sys"))
    for d, mode in (("/tmp", "1777"), ("/var/tmp", "1777"), ("/run", "0755")):
        _tmpfs(at(d), mode)
    os.mkdir(at("/run/lock"), 0o1777)
    os.chmod(at("/run/lock"), 0o1777)
    # what Python needs, read-only at the same paths (fresh 0755 ancestors: a 0700 home is no
    # obstacle), at the path the worker uses and, when a link leads there, at the real one
    hidden = [os.path.realpath(h) for h in cfg.get("hide", [])]
    sites = [os.path.abspath(p) for p in cfg.get("package_dirs", [])]
    needed = {os.path.abspath(p) for p in (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix,
                                           *sites, cfg["harness_parent"])}
    extra = {os.path.abspath(p) for key in ("LD_LIBRARY_PATH", "CUDA_HOME")
             for p in os.environ.get(key, "").split(":") if os.path.isabs(p) and os.path.isdir(p)}
    bound = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    for p in sorted(needed | extra, key=len):
        real = os.path.realpath(p)
        if real == "/" or any(_under(h, [real]) or _under(real, [h]) for h in hidden):
            if p in needed:
                raise IsolationError(f"{p} holds hidden course files: it cannot be part of the worker's view")
            notes.append(f"not exposing {p}: it holds hidden course files")
            continue
        for target in dict.fromkeys([real, p]):
            if not _under(_through_links(target), bound):
                _bind(real, at(target))
                bound.append(target)
    masked = set()
    for site in sites:  # an installed (non-editable) harness: only the staged copy is importable
        for target in (os.path.realpath(site), site):
            mask = os.path.realpath(at(os.path.join(target, "harness")))
            if os.path.isdir(mask) and mask not in masked:
                _mount("tmpfs", mask, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0555,size=4k")
                masked.add(mask)
    _mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(new)
    if SYS_PIVOT_ROOT is not None and _libc.syscall(SYS_PIVOT_ROOT, b".", b".") == 0:
        if _libc.umount2(b".", MNT_DETACH) != 0:  # the old root, stacked on the new one
            raise IsolationError(f"detaching the old root: {os.strerror(ctypes.get_errno())}")
    else:
        notes.append("no pivot_root: chroot instead")
        os.chroot(".")
    os.chdir("/")
    return notes


def _untraversable(path: str) -> str | None:
    """The first ancestor of ``path`` that others cannot traverse (e.g. a 0700 /root
    holding pyenv's Python), or None."""
    cur = "/"
    for name in os.path.abspath(path).split(os.sep)[1:]:
        if not os.stat(cur).st_mode & stat.S_IXOTH:
            return cur
        cur = os.path.join(cur, name)
    return None


def _drop_capabilities() -> bool:
    """Still root (in a user namespace, started by a non-root grader): give up every
    capability, bounding set included, so the worker cannot undo its root (remount a
    read-only bind read-write, unmount a mask)."""
    PR_CAPBSET_DROP, LINUX_CAPABILITY_VERSION_3 = 24, 0x20080522
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header, data = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0), (ctypes.c_uint32 * 6)()
    return _libc.capset(header, data) == 0


PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
PRIVATE_TMP = (("/tmp", "1777"), ("/var/tmp", "1777"), ("/dev/shm", "1777"))  # each server's own


def isolate(cfg: dict) -> list[str]:
    """The launcher's steps 1-3 of the module docstring (loopback, root, limits), while it may
    still be root in its namespaces; returns notes on what could not be done. Raises
    IsolationError when the root cannot be built, or when there are no namespaces and no
    other uid to drop to (student code never runs as the grader's user beside readable
    graders: an infrastructure failure). The launcher adopts every orphan of its servers
    (a child subreaper; in a new pid namespace it is pid 1 anyway), so its process tree is
    the whole worker."""
    notes = []
    if cfg.get("namespaces"):
        if not loopback_up():
            notes.append("could not bring up the private loopback")
        notes += _build_root(cfg)
        os.chdir("/")
    else:
        if cfg.get("uid") is None:
            raise IsolationError("no namespaces on this host and no other user to run the submission as: "
                                 "refusing to run student code as the grader's own user")
        if _untraversable(sys.base_prefix):
            raise IsolationError(f"no namespaces on this host, and the worker's user cannot reach the interpreter "
                                 f"at {sys.base_prefix} (under {_untraversable(sys.base_prefix)})")
        notes.append("no namespaces on this host: the worker sees the disk as its user may (every hidden path "
                     "is checked unreadable before the submission runs)")
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
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() == 1 and not cfg.get("namespaces"):
        os._exit(3)  # the grader is already gone
    return notes


def isolate_server(cfg: dict) -> str:
    """In a server, before anything of the submission: with namespaces, a mount and an IPC
    namespace of its own with fresh tmpfs on ``PRIVATE_TMP`` (the ranks of one worker share
    no file and no System V object: what they exchange crosses the measured loopback), its
    working directory ``/tmp/work``; then :func:`drop`. Without namespaces, a fresh working
    directory under the worker's, and every hidden path but the submission's own folder
    (``cfg["own"]``: the student's code, hidden only where a mount namespace can) checked
    unreadable after the drop. Returns the working directory. Raises IsolationError (an
    infrastructure failure)."""
    if cfg.get("namespaces"):
        if _libc.unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0:
            raise IsolationError(f"unshare of the server's mount and IPC namespaces: "
                                 f"{os.strerror(ctypes.get_errno())}")
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        for d, mode in PRIVATE_TMP:
            _fresh_tmpfs(d, mode)
        work = "/tmp/work"
    else:
        work = os.path.join(cfg["workdir"], f"server-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    if cfg.get("uid") is not None and os.geteuid() == 0:
        os.chown(work, cfg["uid"], cfg["gid"])
    os.chdir(work)
    os.environ.update(HOME=work, TMPDIR=work, TRITON_CACHE_DIR=os.path.join(work, ".triton"),
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(work, ".inductor"), MPLCONFIGDIR=work)
    drop(cfg)
    if not cfg.get("namespaces"):
        readable = [h for h in cfg.get("hide", []) + cfg.get("private", [])
                    if h != cfg.get("own") and (os.access(h, os.R_OK) or os.access(h, os.X_OK))]
        if readable:
            raise IsolationError(f"no namespaces on this host and the worker's user can read {readable[0]}: "
                                 f"refusing to run student code beside readable hidden files")
    return work


MS_MOVE = 8192


def _fresh_tmpfs(d: str, mode: str) -> None:
    """A fresh tmpfs on ``d``, keeping what the root bound below it (a course or venv under
    /tmp, the staged harness in the worker's directory): the old mount is moved aside, the
    new one mounted, each top-level bind below the old one moved back to its path, and the
    old tmpfs (the launcher's files) detached."""
    binds = sorted((m for m in _mounts_under(d) if m != d), key=len)
    tops = [m for m in binds if not any(_under(m, [o]) and m != o for o in binds)]
    hold = f"/run/labs-old-{os.getpid()}" + d.replace("/", "-")  # /run is one tmpfs for every server
    os.makedirs(hold, exist_ok=True)
    _mount(d, hold, None, MS_MOVE)
    _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size=512m")
    for m in tops:
        src = hold + m[len(d):]
        if os.path.isdir(src):
            os.makedirs(m, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(m), exist_ok=True)
            os.close(os.open(m, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(src, m, None, MS_MOVE)
    for parent in {os.path.dirname(m) for m in tops}:  # the fresh directories leading to them: not writable
        while parent != d and parent.startswith(d):
            os.chmod(parent, 0o755)
            parent = os.path.dirname(parent)
    if _libc.umount2(hold.encode(), MNT_DETACH) != 0:
        raise IsolationError(f"detaching the launcher's {d}: {os.strerror(ctypes.get_errno())}")
    os.rmdir(hold)


def drop(cfg: dict) -> None:
    """Step 4: give up the grader's powers for good: the grading's uid (groups cleared) when
    started as root, or, still root in a user namespace, every capability (it cannot remount or
    unmount its view); ``no_new_privs``; SIGKILL when the parent dies (after setuid, which
    clears it)."""
    if cfg.get("uid") is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    if os.geteuid() == 0 and cfg.get("namespaces") and not _drop_capabilities():
        raise IsolationError("could not drop capabilities")
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)


MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable, as a write to each would


def private_memory() -> int:
    """Give this (forked) server its own copy now of every page it still shares with the
    launcher copy-on-write: ``madvise(MADV_POPULATE_WRITE)`` over the present, not exclusively
    mapped pages of its private writable mappings (``/proc/self/pagemap`` bits 63 and 56). The
    copies are charged to the server's cgroup at once, so the memory charged to it later is
    what it makes, not the pages a first call happens to write (about 60 MB on the first
    torch call after a fork). Returns the bytes copied; 0 where the kernel cannot."""
    import array
    page = os.sysconf("SC_PAGE_SIZE")
    present, exclusive = 1 << 63, 1 << 56
    copied = 0
    _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return 0
    try:
        for line in maps:
            fields = line.split()
            if len(fields) < 2 or fields[1] != "rw-p":
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            entries = array.array("Q")
            entries.frombytes(os.pread(fd, (hi - lo) // page * 8, lo // page * 8))
            start = None
            for i, e in enumerate(itertools.chain(entries, [0])):
                shared = e & present and not e & exclusive
                if shared and start is None:
                    start = i
                elif not shared and start is not None:
                    n = (i - start) * page
                    if _libc.madvise(lo + start * page, n, MADV_POPULATE_WRITE) != 0:
                        if ctypes.get_errno() == errno.EINVAL:  # an older kernel: nothing to do
                            return copied
                    else:
                        copied += n
                    start = None
    finally:
        os.close(fd)
    return copied


def loopback_up() -> bool:
    """Set ``lo`` up in this (new, private) network namespace: SIOCGIFFLAGS / SIOCSIFFLAGS."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    import fcntl
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("16sh", b"lo", 0)
            flags = struct.unpack("16sh", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
            if not flags & IFF_UP:
                fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
        return True
    except OSError:
        return False
