"""harness.forkserver on its own: a run is a fresh fork of the warm server, compiles nothing
into the tree it runs in, and finds the server's warm state (plugins, frozen heap, bytecode cache)."""
from __future__ import annotations

import json
import os
import resource
import textwrap
import time

from harness import forkserver

PROBE = textwrap.dedent('''
    import gc, json, os, sys

    def test_report():
        harness = sys.modules["harness"]
        state = {"prefix": sys.pycache_prefix, "frozen": gc.get_freeze_count(), "left": hasattr(harness, "LEFT"),
                 "xdist": "xdist.plugin" in sys.modules, "pid": os.getpid()}
        harness.LEFT = True
        with open(os.environ["PROBE_OUT"], "a") as f:
            f.write(json.dumps(state) + "\\n")
''')


def test_runs_share_the_warm_server_and_write_no_bytecode_into_the_tree(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path.parent / f"{tmp_path.name}-probe.jsonl"
    env = {**os.environ, "PROBE_OUT": str(out), "PYTHONDONTWRITEBYTECODE": "1"}
    for _ in range(2):
        code, text, timed_out = forkserver.run([str(tmp_path), "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
                                               cwd=tmp_path, env=env, timeout=120)
        assert (code, timed_out) == (0, False), text
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first["pid"] != second["pid"] and not second["left"], "each run is a fresh fork: nothing of the last"
    assert first["frozen"] > 0 and first["xdist"], "a run forks from the warm server (frozen heap, plugins imported)"
    prefix = first["prefix"]
    assert prefix and not prefix.startswith(str(tmp_path)), "the rewritten test modules are cached outside the tree"
    assert not list(tmp_path.rglob("__pycache__")), "a run wrote bytecode into the course tree"
    assert list(os.scandir(prefix)), "the first run cached the rewritten test module for the next"


BUSY = textwrap.dedent('''
    import time

    def test_busy():
        end = time.process_time() + 1.0
        while time.process_time() < end:
            pass
''')


def test_a_closed_server_is_waited_for_so_its_runs_cpu_counts_in_ours(tmp_path):
    """`/usr/bin/time labs grade` counts the runs' CPU: the process waits for its server at
    exit, and the server for its runs and its zygote (shutting the socket down wakes the server)."""
    (tmp_path / "test_busy.py").write_text(BUSY)
    server = forkserver.ForkServer()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, text, _ = server.run([str(tmp_path), "-q", "-p", "no:cacheprovider", "-p", "no:randomly"], cwd=tmp_path,
                               env=dict(os.environ), timeout=120)
    assert code == 0, text
    t0 = time.monotonic()
    server.close()
    assert server.proc.returncode == 0 and time.monotonic() - t0 < 5, "the server did not end when closed"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime >= 0.9


def test_the_server_outlives_the_thread_that_started_it(tmp_path):
    """A grading pool's thread starts the process's server and ends (grade-all's last job): the
    server must not die with it (PR_SET_PDEATHSIG follows the thread that forked it)."""
    import threading
    (tmp_path / "test_probe.py").write_text("def test_ok():\n    pass\n")
    argv = [str(tmp_path), "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    forkserver._SERVER.clear()  # a server of this thread's own, as a fresh grading process has none
    t = threading.Thread(target=forkserver.run, args=(argv,), kwargs=dict(cwd=tmp_path, env=dict(os.environ),
                                                                          timeout=120))
    t.start()
    t.join()
    server = forkserver._SERVER[0]
    time.sleep(1.0)
    assert server.proc.poll() is None, "the server died with the thread that started it"
    code, text, _ = forkserver.run(argv, cwd=tmp_path, env=dict(os.environ), timeout=120)
    assert code == 0 and forkserver._SERVER[0] is server, text
