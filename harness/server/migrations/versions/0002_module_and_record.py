"""submissions keep the module validated at intake, results the typed record (issue 28)

Revision ID: 0002
Revises: 0001

Before, ``submissions.blob`` held the upload as sent (an archive) and ``results.data``
Gradescope's results.json; now the first holds the lab's module, taken from the
archive as the intake takes it (``grading.take``), and the second the record
``records.Graded.to_json()``, read back from the results.json it replaces
(``_record``: tests, parts, perf figures, status; the late penalty stays in the
``score`` column and is applied to every export). A database with rows to convert
needs the course (its labs' module names): ``db.upgrade(url, course)``, as every
course-server command calls it; an empty one needs none.
"""
import io
import json
import tarfile
import tempfile
from pathlib import Path

import sqlalchemy as sa
from alembic import op

from harness import grading, records
from harness.manifest import LabPaths

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

SUBMISSIONS = sa.text("SELECT id, lab, filename, blob FROM submissions")
RESULTS = sa.text("SELECT results.id, results.data, submissions.lab FROM results "
                  "JOIN submissions ON submissions.id = results.submission_id")


def _course():
    course = op.get_context().config.attributes.get("course")
    if course is None:
        raise RuntimeError("the course database holds submissions to convert, and this upgrade was not given "
                           "the course: run `labs serve` (or any `labs` server command) in the course")
    return course


def upgrade() -> None:
    conn = op.get_bind()
    subs, results = conn.execute(SUBMISSIONS).all(), conn.execute(RESULTS).all()
    course = _course() if subs or results else None
    for sub_id, lab, filename, blob in subs:
        with tempfile.TemporaryDirectory(prefix="labs-migrate-") as tmp:
            archive = Path(tmp) / Path(filename).name
            archive.write_bytes(blob)
            module = grading.take(archive, course.lab(lab), Path(tmp))
        conn.execute(sa.text("UPDATE submissions SET blob = :blob WHERE id = :id"), {"blob": module.data, "id": sub_id})
    for result_id, data, lab in results:
        record = _record(json.loads(data), course.lab(lab))
        conn.execute(sa.text("UPDATE results SET data = :data WHERE id = :id"),
                     {"data": json.dumps(record.to_json()), "id": result_id})


def _record(res: dict, lab) -> records.Graded:
    """The record behind a results.json the course server stored before: what its views
    show (each test's part, points, status and message; the perf figures; the status)."""
    extra = res.get("extra_data") or {}
    status = extra.get("status", "ok")
    tests = []
    for t in res.get("tests", []):
        ed, tags = t.get("extra_data") or {}, t.get("tags") or []
        part, not_run = ed.get("part", ""), "not_run_points" in ed
        output = t.get("output", "")
        tests.append(records.TestResult(
            name=t["name"].removeprefix(f"{part}: "), nodeid=t["name"], part=part,
            max_score=ed["not_run_points"] if not_run else t["max_score"], score=t["score"],
            outcome="skipped" if not_run else "passed" if t.get("status") == "passed" else "failed",
            output=output.partition(" points: ")[2] if not_run else output, tags=tags, bonus="bonus" in tags))
    if tests:  # which test recorded which figure is not in results.json: the figures are
        tests[0].perf = [{"name": e["name"], "ratio": e["value"]} for e in res.get("leaderboard", [])]
    lines = (res.get("output") or "").splitlines()
    result = records.GradeResult(
        lab=lab.number, submission="", seed=extra.get("seed") or 0, tests=tests,
        duration_s=res.get("execution_time", 0.0), notes=lines[1:] if status != "ok" else lines,
        ignored=extra.get("ignored_files") or [], module=extra.get("module", ""),
        stopped=status.removeprefix("timeout: ") if status.startswith("timeout: ") else "")
    return records.Graded(lab.number, status, extra.get("status_kind", "ok"), extra.get("max_score", lab.points),
                          result if tests else None, res.get("execution_time", 0.0),
                          scored=res.get("score") is not None)


def downgrade() -> None:
    conn = op.get_bind()
    subs = conn.execute(SUBMISSIONS).all()
    course = _course() if subs else None
    for sub_id, lab, filename, blob in subs:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:  # what `labs submit` uploads (grading.pack_module)
            info = tarfile.TarInfo(LabPaths.of(course.lab(lab)).in_impl("").as_posix())
            info.size, info.mode, info.mtime = len(blob), 0o644, 0
            tar.addfile(info, io.BytesIO(blob))
        conn.execute(sa.text("UPDATE submissions SET blob = :blob, filename = :name WHERE id = :id"),
                     {"blob": buf.getvalue(), "name": f"{lab}.tar.gz", "id": sub_id})
    for result_id, data, _ in conn.execute(RESULTS).all():
        conn.execute(sa.text("UPDATE results SET data = :data WHERE id = :id"),
                     {"data": json.dumps(records.Graded.from_json(json.loads(data)).to_gradescope()), "id": result_id})
