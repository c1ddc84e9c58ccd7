"""How fast grading is: the figures staff size a course with (issue "Grading fast enough for a class").

Prints one table: per lab, the reference graded with the hidden graders (wall seconds and
CPU seconds of everything it ran: the grader run, its sandbox workers and their ranks), the
stub, and a submission that hangs at import (status and wall seconds: the limit plus at most
10 s is the target); then all labs of one student in all, and a class of N reference
submissions of one lab graded with ``grade-all --jobs 2`` against N x one warm grading / 2 x 1.2
(and the CPU seconds a submission costs there against one graded alone).

CPU seconds come from a cgroup holding this process and all it starts (root, where cgroups
can be made: ``harness.sandbox.cgroups``); elsewhere the column is empty. Run it on a quiet
machine; ``--labs 01,03`` limits the labs, ``--class-size 0`` skips the class.

    python scripts/bench_grading.py [--labs 01,03] [--class-size 50] [--class-lab 03] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import classroom, forkserver, grading, manifest  # noqa: E402
from harness.sandbox import cgroups  # noqa: E402

HANG = "import time\ntime.sleep(10 ** 6)\n"


class Clock:
    """Wall and CPU seconds of everything this process runs: a cgroup of its own that it moves
    into before it starts anything (the workers' cgroups are then made below it), where cgroups
    can be made; else wall seconds only."""

    def __init__(self):
        hier = cgroups.hierarchy()
        self.group = cgroups.Group(hier, f"labs-bench-{os.getpid()}") if hier is not None else None
        if self.group is not None:
            self.group.create()
            self.group.add(os.getpid())
            cgroups.hierarchy.cache_clear()  # the workers' cgroups go below ours from now on

    def __call__(self):
        return time.monotonic(), (self.group.cpu_seconds() if self.group is not None else None)

    def close(self):
        if self.group is not None:  # back to where we were, then ours goes
            for base in self.group.hier.bases.values():
                (base / "cgroup.procs").write_text(str(os.getpid()))
            self.group.remove()


def timed(clock, fn):
    w0, c0 = clock()
    out = fn()
    w1, c1 = clock()
    return out, w1 - w0, (None if c0 is None else c1 - c0)


def fmt(x, unit="s"):
    return "" if x is None else f"{x:.1f} {unit}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", default="", help="comma-separated lab numbers (default: every lab with graders)")
    ap.add_argument("--class-size", type=int, default=50, help="submissions in the class run (0: skip it)")
    ap.add_argument("--class-lab", default="03", help="the lab of the class run")
    ap.add_argument("--json", default="", help="also write the figures here")
    args = ap.parse_args()
    course = manifest.load(ROOT)
    labs = [n for n in (args.labs.split(",") if args.labs else sorted(course.labs)) if (ROOT / "graders" / n).is_dir()]
    clock = Clock()
    rows, figures = [], {"labs": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="labs-bench-") as tmp:
            # once per grading process: the warm grader and the sandbox's zygote (harness.forkserver)
            _, w, c = timed(clock, lambda: forkserver.run(["--version"], cwd=ROOT, env=dict(os.environ), timeout=600))
            figures["warm_up"] = {"wall_s": w, "cpu_s": c}
            print(f"warm-up (the warm grader and the zygote, once per grading process): {fmt(w)} wall, {fmt(c)} CPU",
                  flush=True)
            total_w = total_c = 0.0
            for n in labs:
                lab = course.lab(n)
                ref, w, c = timed(clock, lambda: grading.grade(ROOT / "solutions", lab, course))
                _, sw, sc = timed(clock, lambda: grading.grade(ROOT / "labs", lab, course))
                hang = Path(tmp) / f"hang{n}" / n / lab.filename
                hang.parent.mkdir(parents=True)
                hang.write_text(HANG)
                row, hw, _ = timed(clock, lambda: classroom.grade_row(
                    classroom.Submission("hang", hang.parent.parent), lab, course))
                total_w += w
                total_c += c or 0.0
                figures["labs"][n] = {"reference_wall_s": w, "reference_cpu_s": c, "score": ref.score,
                                      "max_runnable": ref.max_score_runnable, "stub_wall_s": sw, "stub_cpu_s": sc,
                                      "hang_status": row.kind.value, "hang_wall_s": hw,
                                      "hang_limit_s": lab.limits.call_timeout_s}
                rows.append((n, fmt(w), fmt(c), f"{ref.score:g}/{ref.max_score_runnable:g}", fmt(sw), fmt(sc),
                             f"{row.kind.value} in {hw:.1f} s"))
                print(*rows[-1], sep="\t", flush=True)
            figures["one_student_all_labs_wall_s"] = total_w
            figures["one_student_all_labs_cpu_s"] = total_c
            if args.class_size:
                lab = course.lab(args.class_lab)
                subs = Path(tmp) / "class"
                for i in range(args.class_size):
                    dest = subs / f"student{i:03d}" / lab.number / lab.filename
                    dest.parent.mkdir(parents=True)
                    shutil.copy(ROOT / "solutions" / lab.number / lab.filename, dest)
                _, one_w, one_c = timed(clock, lambda: grading.grade(ROOT / "solutions", lab, course))  # warm
                run, w, c = timed(clock, lambda: classroom.grade_all(subs, lab, course, Path(tmp) / "out", jobs=2))
                figures["class"] = {"lab": lab.number, "size": args.class_size, "wall_s": w, "cpu_s": c,
                                    "one_wall_s": one_w, "one_cpu_s": one_c,
                                    "target_s": args.class_size * one_w / 2 * 1.2}
    finally:
        clock.close()
    print("\nlab\tref wall\tref cpu\tref score\tstub wall\tstub cpu\thanging submission")
    for r in rows:
        print(*r, sep="\t")
    walls = sorted(f["reference_wall_s"] for f in figures["labs"].values())
    if walls:
        print(f"\nmedian lab {walls[len(walls) // 2]:.1f} s (target 8), slowest {walls[-1]:.1f} s (target 20); "
              f"all labs of one student {figures['one_student_all_labs_wall_s']:.1f} s wall, "
              f"{figures['one_student_all_labs_cpu_s']:.1f} s CPU (target 180 s)")
    if "class" in figures:
        k = figures["class"]
        print(f"class of {k['size']} (lab {k['lab']}, --jobs 2): {k['wall_s']:.1f} s wall, target {k['target_s']:.1f} s "
              f"(N x one warm grading of {k['one_wall_s']:.1f} s / 2 x 1.2)"
              + (f"; {k['cpu_s'] / k['size']:.2f} CPU s a submission, {k['one_cpu_s']:.2f} graded alone"
                 if k["cpu_s"] is not None else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
