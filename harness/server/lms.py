"""Grades for a learning management system: one lab's grades as the file Canvas or
Moodle imports, or a plain CSV, from the course server's newest grades (the late
penalty applied, as the ``score`` column stores it) or from a ``labs grade-all`` folder.

Canvas (Gradebook > Import): the header ``Student, ID, SIS User ID, SIS Login ID,
Section, <assignment>``, then the row ``    Points Possible`` with the lab's points
under the assignment, then one row per student (Canvas matches a row by ID, SIS User
ID, SIS Login ID, then name: the login column holds the roster's e-mail, else name).
Moodle (Grades > Import > CSV file): the header ``First name, Surname, Username,
Email address, <grade item>, Feedback: <grade item>``, one row per student; at import
staff map ``Email address`` (or ``Username``) to the user and the grade column to
the lab's grade item. A grade that does not exist (an infrastructure failure) is an
empty cell, which both leave unchanged.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import LabsError
from ..manifest import Course, Lab
from . import latedays
from .db import Account
from .service import newest_results, results_json

FORMATS = ("canvas", "moodle", "csv")
CANVAS_POINTS = "    Points Possible"  # the row Canvas writes in its own export and reads back


@dataclass
class Grade:
    """One student's grade of a lab: ``score`` None when there is none to record."""
    student: str
    email: str
    score: float | None
    max_score: float
    late_days: int = 0  # days late, after the student's extension
    charged_days: int = 0  # of those, the days the late-day budget did not cover: each costs the penalty
    status: str = ""


def check_format(fmt: str) -> str:
    """``fmt`` if it is one of ``FORMATS``; else a LabsError naming it."""
    if fmt not in FORMATS:
        raise LabsError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


def from_server(s: Session, course: Course, lab: Lab) -> list[Grade]:
    """Each student's newest graded submission of ``lab``, its score after the late
    penalty for the late days the student's budget does not cover (``latedays``)."""
    emails = dict(s.execute(select(Account.name, Account.email)).all())
    rows = []
    for name, res, sub in newest_results(s, lab.number):
        score = results_json(course, res)["score"]
        rows.append(Grade(name, emails.get(name, ""), score, res.max_score,
                          latedays.sub_days(s, course, sub), latedays.charged(course, sub), res.status))
    return rows


def from_folder(folder: Path, lab: Lab) -> list[Grade]:
    """The grades in a ``labs grade-all`` output folder (its ``grades.csv``)."""
    path = folder / "grades.csv"
    if not path.is_file():
        raise LabsError(f"--from {folder}: no grades.csv there", hint="pass the --out folder of `labs grade-all`")
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r.get("lab") not in (None, lab.number):
                raise LabsError(f"--from {folder}: its grades.csv is lab {r['lab']}'s, not lab {lab.number}'s")
            score = float(r["score"]) if r.get("score") else None
            rows.append(Grade(r["student"], "", score, float(r.get("max") or lab.points), status=r.get("status", "")))
    return rows


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:g}"


def render(rows: list[Grade], fmt: str, lab: Lab, assignment: str | None = None) -> str:
    """The file ``fmt`` describes (see the module docstring), as text. ``assignment``:
    the LMS column or grade item (default ``Lab NN: title``)."""
    check_format(fmt)
    item = assignment or f"Lab {lab.number}: {lab.title}"
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n" if fmt == "canvas" else "\n")
    rows = sorted(rows, key=lambda g: g.student)
    if fmt == "canvas":
        w.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", item])
        w.writerow([CANVAS_POINTS, "", "", "", "", f"{lab.points:g}"])
        for g in rows:
            w.writerow([g.student, "", "", g.email or g.student, "", _num(g.score)])
    elif fmt == "moodle":
        w.writerow(["First name", "Surname", "Username", "Email address", item, f"Feedback: {item}"])
        for g in rows:
            w.writerow([g.student, "", g.student, g.email, _num(g.score), g.status])
    else:
        w.writerow(["student", "email", "lab", "score", "max_score", "late_days", "charged_days", "status"])
        for g in rows:
            w.writerow([g.student, g.email, lab.number, _num(g.score), _num(g.max_score), g.late_days,
                        g.charged_days, g.status])
    return out.getvalue()
