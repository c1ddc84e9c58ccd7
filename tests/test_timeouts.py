"""A hanging submission gets its row fast, with status ``timeout``, and the next one is not charged
for it (issues "Grading fast enough for a class" 4 and "A course server and class grading that
hold a real class" 3): a submission sleeping at import, and one deadlocking in a collective, are
graded with status ``timeout`` within the lab's limit plus 10 s (beyond the fixed cost of any
grading, measured here on the stub), their untouched tests recorded as not run; the reference
graded right after, in the same class, gets full marks. A call limit is the worker's CPU time
(load cannot inflate it) with a wall-clock backstop only for a call that waits."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness import classroom, forkserver, grading
from harness.sandbox import worker as sandbox

from .conftest import ROOT, course, materialize_mutant

COURSE = course()
LAB = COURSE.lab("01")
SLEEPS_AT_IMPORT = "import time\ntime.sleep(10 ** 6)\n"
RUN_LIMIT_S = 15.0  # graders/01's per-run limit of its small cases (SMALL_T)


def _call_limit_s(lab) -> float:
    """The plugin's per-call wall limit of ``lab`` (harness.plugin._worker_config)."""
    return min(lab.limits.call_timeout_s, max(5.0, lab.limits.test_timeout_s - 5))


def test_hanging_submissions_time_out_fast_and_the_next_is_graded_fully(tmp_path):
    subs = tmp_path / "subs"
    (subs / "a_sleeps" / LAB.number).mkdir(parents=True)
    (subs / "a_sleeps" / LAB.number / LAB.filename).write_text(SLEEPS_AT_IMPORT)
    materialize_mutant(ROOT / "tests" / "mutants" / "01" / "deadlock_blocking_send.py", LAB, subs / "b_deadlocks")
    (subs / "c_reference" / LAB.number).mkdir(parents=True)
    (subs / "c_reference" / LAB.number / LAB.filename).write_text(
        (ROOT / "solutions" / LAB.number / LAB.filename).read_text())
    t0 = time.monotonic()
    grading.grade(ROOT / "labs", LAB, COURSE, select="test_reduce_scatter_returns_reduced_chunk_of_rank and W2")
    fixed = time.monotonic() - t0  # what any grading of this lab costs here: a grader run, a worker, its ranks
    run = classroom.grade_all(subs, LAB, COURSE, tmp_path / "out", jobs=1)
    rows = {r.student: r for r in run.rows}
    sleeps, deadlocks, ref = rows["a_sleeps"], rows["b_deadlocks"], rows["c_reference"]
    assert sleeps.kind is classroom.Status.TIMEOUT and sleeps.status.startswith("timeout: importing"), sleeps.status
    assert sleeps.duration_s <= _call_limit_s(LAB) + 10 + fixed, \
        f"a submission sleeping at import got its row after {sleeps.duration_s:.1f} s"
    assert deadlocks.kind is classroom.Status.TIMEOUT and "deadlock" in deadlocks.status, deadlocks.status
    assert deadlocks.duration_s <= 2 * RUN_LIMIT_S + 10 + fixed, \
        f"a deadlocking submission got its row after {deadlocks.duration_s:.1f} s"
    not_run = [t for t in deadlocks.results["tests"] if "not run" in t["output"]]
    assert not_run and all(t["score"] == 0 for t in not_run), "the tests after two timeouts are not run"
    assert ref.kind is classroom.Status.OK, ref.status
    assert ref.results["score"] == pytest.approx(ref.results["extra_data"]["max_score_runnable"])
    assert not _live_workers(), "a worker or a rank of the class is still running after its row"


def _live_workers() -> list[str]:
    """The processes still alive below this process's zygote (every sandbox worker and its ranks
    are forked from it, harness.sandbox.zygote), as 'pid cmdline'; zombies hold nothing."""
    procs = {}
    for p in Path("/proc").glob("[0-9]*"):
        try:
            status = dict(line.split(":\t", 1) for line in (p / "status").read_text().splitlines() if ":\t" in line)
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        procs[int(p.name)] = (int(status["PPid"]), status["State"], cmd)
    server = forkserver._SERVER[0].proc.pid
    zygotes = [pid for pid, (ppid, _, cmd) in procs.items() if ppid == server and "sandbox.zygote" in cmd]
    assert zygotes, "no zygote under this process's warm grader"
    below, frontier = [], list(zygotes)
    while frontier:
        kids = [pid for pid, (ppid, _, _) in procs.items() if ppid in frontier]
        below += kids
        frontier = kids
    return [f"{pid} {procs[pid][2][:80]}" for pid in below if not procs[pid][1].startswith("Z")]


BUSY_THEN_ANSWER = '''
import time

def busy(seconds):
    """Compute for ``seconds`` of CPU time, however long that takes on this machine."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return True

def sleep(seconds):
    time.sleep(seconds)
    return True
'''


def _toy(tmp_path: Path, wall_s: float, cpu_s: float) -> sandbox.RemoteModule:
    path = tmp_path / "toy.py"
    path.write_text(BUSY_THEN_ANSWER)
    sb = sandbox.Sandbox(sandbox.WorkerConfig(module_source=BUSY_THEN_ANSWER, module_filename="toy.py",
                                              call_timeout_s=wall_s, call_cpu_s=cpu_s), path)
    sb.ensure()
    sb.begin_test()
    return sandbox.RemoteModule(sb, path, "toy")


def test_a_call_that_computes_past_its_wall_limit_is_not_stopped_but_one_that_waits_is(tmp_path):
    """A call limit cannot be tripped by the machine's load: a call still computing at its wall
    limit goes on (up to its CPU limit); one that waits (a sleep, a deadlock) is stopped there."""
    toy = _toy(tmp_path, wall_s=1.0, cpu_s=20.0)
    try:
        assert toy.busy(2.5)  # 2.5 CPU s: past the 1 s wall limit on any machine, within the CPU limit
        t0 = time.monotonic()
        with pytest.raises(sandbox.WorkerTimeout, match="waiting, not computing"):
            toy.sleep(60)
        assert time.monotonic() - t0 < 15
    finally:
        toy._sandbox.close()


def test_a_call_past_its_cpu_limit_is_stopped(tmp_path):
    toy = _toy(tmp_path, wall_s=60.0, cpu_s=1.0)
    try:
        with pytest.raises(sandbox.WorkerTimeout, match="CPU seconds"):
            toy.busy(30)
    finally:
        toy._sandbox.close()
