"""Figures from the whole worker, and nothing of it left behind (issue "Figures from the whole
worker"): memory, CPU time and processes are read for every process a server starts (its
cgroup, else /proc of its subtree), however the submission hides its work (a forked child
serving the channel, a helper thread, a tmpfs file); the ranks of one worker share no /tmp and
no System V IPC; after a worker, no process, cgroup or IPC object of it is left on the host; and
where the worker cannot be isolated, no student code runs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from harness.sandbox import calls, cgroups, isolation
from harness.sandbox import ranks
from harness.sandbox import worker as sandbox

from .conftest import ROOT

HIDER = textwrap.dedent('''
    import ctypes, os, queue, threading, time

    if os.environ.get("HIDE_FORK", "1") == "1" and os.fork() != 0:
        while True:  # the decoy: the process the grader found sleeps; its child serves the channel
            time.sleep(3600)

    _kept = []
    _jobs, _done = queue.Queue(), queue.Queue()

    def _helper():
        while True:
            _done.put(_jobs.get()())

    threading.Thread(target=_helper, daemon=True).start()

    def grow(mib):
        _kept.append(bytearray(mib << 20))
        for i in range(0, len(_kept[-1]), 4096):
            _kept[-1][i] = 1
        return True

    def to_shm(mib):
        with open(f"/dev/shm/kept-{len(_kept)}", "wb") as f:
            f.write(b"x" * (mib << 20))
        _kept.append(None)
        return True

    def spin_in_helper(seconds):
        def work():
            end = time.thread_time() + seconds
            while time.thread_time() < end:
                pass
            return True
        _jobs.put(work)
        return _done.get()

    def whoami():
        return os.getuid()

    def litter():
        """Leave what a worker must not leave: System V objects, a daemon, files."""
        libc = ctypes.CDLL(None)
        shm = libc.shmget(0, 1 << 20, 0o1600)  # IPC_PRIVATE | IPC_CREAT
        msg = libc.msgget(0, 0o1600)
        open("/tmp/left-behind", "w").write("x")
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(3600)
            os._exit(0)
        return [shm, msg]

    def write_shared(name):
        for d in ("/tmp", "/dev/shm"):
            open(os.path.join(d, name), "w").write("from a rank")
        return True

    def barrier():
        import torch.distributed as dist
        dist.barrier()
        return True

    def sees(name):
        return [os.path.exists(os.path.join(d, name)) for d in ("/tmp", "/dev/shm")]
''')


def _sandbox(tmp_path: Path, servers: int = 1) -> sandbox.Sandbox:
    path = tmp_path / "hider.py"
    path.write_text(HIDER)
    cfg = sandbox.WorkerConfig(module_source=HIDER, module_filename="hider.py", call_timeout_s=60, servers=servers,
                               hide=[str(ROOT / "graders"), str(ROOT / "solutions"), str(ROOT / "tests")])
    return sandbox.Sandbox(cfg, path)


@pytest.fixture
def hider(tmp_path):
    sb = _sandbox(tmp_path)
    sb.ensure()
    sb.begin_test()
    yield sandbox.RemoteModule(sb, sb.module_path, "hider")
    sb.close()


def _need_isolation():
    if not isolation.isolation_prefix() or os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the CI host must give the sandbox namespaces and root")
        pytest.skip("needs namespaces and root")


def test_memory_held_by_a_forked_child_counts(hider):
    _need_isolation()
    before = calls.resident_bytes(hider)
    assert hider.grow(64)
    after = calls.resident_bytes(hider)
    assert after - before >= 60 << 20, f"64 MiB held by a forked child read as {(after - before) / 2**20:.1f} MiB"


def test_memory_kept_in_a_tmpfs_file_counts(hider):
    _need_isolation()
    before = calls.resident_bytes(hider)
    assert hider.to_shm(48)
    after = calls.resident_bytes(hider)
    assert after - before >= 44 << 20, f"48 MiB in /dev/shm read as {(after - before) / 2**20:.1f} MiB"


def test_peak_memory_of_a_forked_child_counts(hider):
    _need_isolation()
    _, m = calls.measure(hider.grow, 64, alloc=False, ops=False)
    assert m.peak_growth_bytes >= 60 << 20, f"peak growth {m.peak_growth_bytes / 2**20:.1f} MiB"


def test_cpu_of_a_helper_thread_in_a_forked_child_counts(hider):
    _need_isolation()
    _, m = calls.measure(hider.spin_in_helper, 0.4, alloc=False, ops=False)
    assert m.cpu_s >= 0.35, f"0.4 s of a helper thread's CPU read as {m.cpu_s:.3f} s"


def test_the_proc_fallback_also_follows_a_forked_child(tmp_path, monkeypatch):
    """Without cgroups (a read-only /sys/fs/cgroup in a container) the figures come from /proc of
    every process of the server's subtree, orphans the launcher adopted included."""
    _need_isolation()
    monkeypatch.setattr(cgroups, "hierarchy", lambda: None)
    sb = _sandbox(tmp_path)
    try:
        sb.ensure()
        sb.begin_test()
        assert sb.worker.groups is None
        impl = sandbox.RemoteModule(sb, sb.module_path, "hider")
        before = calls.resident_bytes(impl)
        assert impl.grow(64)
        assert calls.resident_bytes(impl) - before >= 60 << 20
        _, m = calls.measure(impl.spin_in_helper, 0.4, alloc=False, ops=False)
        assert m.cpu_s >= 0.35
    finally:
        sb.close()


def test_nothing_of_the_worker_is_left_on_the_host(tmp_path):
    _need_isolation()
    sb = _sandbox(tmp_path)
    sb.ensure()
    sb.begin_test()
    impl = sandbox.RemoteModule(sb, sb.module_path, "hider")
    uid = impl.whoami()
    assert uid != 0
    assert all(i >= 0 for i in impl.litter())
    groups = sb.worker.groups
    dirs = groups.worker.dirs() if groups is not None else []
    workdir = sb.worker.workdir
    sb.close()
    deadline = time.monotonic() + 10  # a killed process is gone once its new parent reaps it
    while (left := _live_processes_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes of the worker's uid {uid} are left: {left}"
    assert not [d for d in dirs if d.exists()], "the worker's cgroups are left"
    for kind in ("shm", "msg", "sem"):
        rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        mine = [r for r in rows if str(uid) in r.split()]
        assert not mine, f"System V {kind} objects of the worker are left on the host: {mine}"
    assert not os.path.exists(workdir)


def _live_processes_of(uid: int) -> list[str]:
    """Processes of ``uid`` that are not zombies (an exited process waiting to be reaped holds nothing)."""
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            fields = dict(line.split(":", 1) for line in (p / "status").read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            out.append(p.name)
    return out


def test_ranks_share_no_tmp_and_no_shared_memory(tmp_path):
    _need_isolation()
    path = tmp_path / "hider.py"
    path.write_text(HIDER.replace('os.environ.get("HIDE_FORK", "1") == "1"', "False"))
    mod = type("M", (), {"__file__": str(path), "__name__": "hider"})()

    def body(rk):
        if rk.rank == 0:
            rk.impl.write_shared("from-rank-0")
        rk.impl.barrier()  # rank 1 looks after rank 0 wrote
        return rk.impl.sees("from-rank-0")

    try:
        seen = ranks.run(body, 2, impl=mod, timeout=60)
    finally:
        ranks.shutdown()
    assert seen[0] == [True, True] and seen[1] == [False, False], seen


NO_ISOLATION = textwrap.dedent('''
    import sys
    from pathlib import Path
    from harness.sandbox import worker as sandbox
    mark = Path(sys.argv[1])
    src = f"open({str(mark)!r}, 'w').write('student code ran')\\n"
    cfg = sandbox.WorkerConfig(module_source=src, module_filename="m.py", call_timeout_s=30,
                               hide=[sys.argv[2]])
    try:
        sandbox.Sandbox(cfg, mark.parent / "m.py").ensure()
        print("STARTED")
    except sandbox.SandboxStartError as e:
        print("REFUSED", e)
''')


def test_without_namespaces_beside_readable_hidden_files_no_student_code_runs(tmp_path):
    """A host that refuses namespaces (forced here), with the course's hidden folders readable by
    any user (or an interpreter the worker's user cannot reach): the worker's start is an
    infrastructure failure and the submission never runs."""
    if os.geteuid() != 0:
        pytest.skip("as root: the worker then has another uid to drop to, and still must not run")
    hidden = tmp_path / "graders"
    hidden.mkdir()
    (hidden / "test_x.py").write_text("SECRET = 1\n")
    os.chmod(tmp_path, 0o755)
    mark = tmp_path / "ran"
    env = {**os.environ, "LABS_SANDBOX_NO_NAMESPACES": "1"}
    p = subprocess.run([sys.executable, "-c", NO_ISOLATION, str(mark), str(hidden)], env=env, capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert "REFUSED" in p.stdout, p.stdout + p.stderr[-2000:]
    assert not mark.exists(), "student code ran without isolation"
