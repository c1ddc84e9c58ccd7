"""Record the sandboxed grader's scores in an nbgrader gradebook: the only scores
that count for a course graded in nbgrader (``labs grade-all --gradebook URL``;
``harness.nbgrader_export`` explains why a notebook kernel never grades). The
names here (assignment ``labNN``, cells ``labNN-module`` and ``labNN-part-X``) are
the ones ``harness.nbgrader_export`` writes into the exported notebooks.

nbgrader's gradebook API: https://nbgrader.readthedocs.io/en/stable/api/gradebook.html
"""
from __future__ import annotations

import warnings

from .records import part_scores
from .manifest import Lab


def assignment_name(lab: Lab) -> str:
    return f"lab{lab.number}"


def module_cell_id(lab: Lab) -> str:
    return f"lab{lab.number}-module"


def part_cell_id(lab: Lab, part: str) -> str:
    """The gradebook's grade cell of a part: written only by ``GradebookWriter``, never in a notebook."""
    return f"lab{lab.number}-part-{part}"


def cell_max_score(lab: Lab, part: str) -> float:
    """A part's grade cell maximum: its points, 0 for a bonus part (its points are extra
    credit), so the assignment's maximum is ``lab.points``, as in ``labs grade`` and grades.csv."""
    p = lab.parts[part]
    return 0.0 if p.bonus else float(p.points)


def comment_line(t: dict) -> str:
    """One test of a ``results.json`` as a line of the gradebook's comment. A test not run
    here (a GPU test on a CPU: no ``status``, ``max_score`` 0) says so and what it is worth."""
    status = t.get("status") or "not run"
    worth = (t.get("extra_data") or {}).get("not_run_points")
    return (f"{float(t.get('score') or 0):g}/{float(t.get('max_score') or 0):g} {status} {t.get('name', '?')}"
            + (f" (worth {float(worth):g})" if worth else ""))


def require_nbgrader():
    """Import nbgrader's gradebook API, or raise ImportError saying how to get it."""
    try:
        import nbgrader.api  # noqa: F401
    except ImportError:
        raise ImportError("nbgrader is not installed (it is the optional extra `nbgrader`)") from None
    return nbgrader.api



class GradebookWriter:
    """Record ``labs grade-all`` results in an nbgrader gradebook (``Gradebook(url)``):
    the only scores that count.

    The lab is assignment ``labNN`` with notebook ``labNN`` (the names
    ``export_course`` uses, so it shares the gradebook of ``nbgrader
    generate_assignment``) and one autograded grade cell ``labNN-part-X`` per
    part (max score = the part's points; 0 for a bonus part), added here: the
    exported notebooks have no grade cells, so ``nbgrader autograde`` never
    writes these scores. Each student's ``auto_score`` per part is set; the
    per-test breakdown is the auto comment on the module cell ``labNN-module``.
    Re-recording overwrites. A bonus part's score is the ``extra_credit`` of its
    cell: the assignment's maximum is ``lab.points`` and a student's score is
    results.json's ``score`` (bonus included), as in grades.csv. A test not run
    here (a GPU test on a CPU: no ``status``) scores 0.
    (nbgrader refuses to regenerate an assignment whose cells differ from the
    gradebook's once it has submissions: run ``generate_assignment`` before
    recording grades.)"""

    def __init__(self, url: str, lab: Lab):
        api = require_nbgrader()
        self.api, self.lab = api, lab
        self.gb = api.Gradebook(url)
        self.assignment = self.notebook = assignment_name(lab)
        self._ensure_structure()

    def _ensure_structure(self):
        api, gb, a, nb = self.api, self.gb, self.assignment, self.notebook
        try:
            gb.find_assignment(a)
        except api.MissingEntry:
            gb.add_assignment(a)
        try:
            gb.find_notebook(nb, a)
        except api.MissingEntry:
            gb.add_notebook(nb, a)
        for key in self.lab.parts:
            top = cell_max_score(self.lab, key)
            try:
                cell = gb.find_grade_cell(part_cell_id(self.lab, key), nb, a)
                if cell.max_score != top:
                    cell.max_score = top
                    gb.db.commit()
            except api.MissingEntry:
                gb.add_grade_cell(part_cell_id(self.lab, key), nb, a, max_score=top, cell_type="code")
        try:
            gb.find_solution_cell(module_cell_id(self.lab), nb, a)
        except api.MissingEntry:
            gb.add_solution_cell(module_cell_id(self.lab), nb, a)

    def _grade(self, cell_id: str, student: str):
        """The student's grade row of a grade cell; made when the submission is older
        than the cell (``nbgrader autograde`` ran before the first recording)."""
        api, gb, a, nb = self.api, self.gb, self.assignment, self.notebook
        try:
            return gb.find_grade(cell_id, nb, a, student)
        except api.MissingEntry:
            grade = api.Grade(cell=gb.find_grade_cell(cell_id, nb, a),
                              notebook=gb.find_submission_notebook(nb, a, student))
            gb.db.add(grade)
            return grade

    def record(self, student: str, results: dict) -> None:
        api, gb, a, nb = self.api, self.gb, self.assignment, self.notebook
        gb.update_or_create_student(student)
        try:
            gb.find_submission(a, student)
        except api.MissingEntry:
            with warnings.catch_warnings():  # nbgrader's own autoflush warnings under SQLAlchemy 2
                warnings.simplefilter("ignore")
                gb.add_submission(a, student)
        scores = part_scores(results)
        for key, part in self.lab.parts.items():
            grade = self._grade(part_cell_id(self.lab, key), student)
            earned = round(min(float(part.points), scores.get(key, 0.0)), 4)
            if part.bonus:  # on top of the maximum: extra credit of a cell worth 0
                grade.auto_score, grade.extra_credit = 0.0, earned
            else:
                grade.auto_score = earned
            grade.needs_manual_grade = False
        status = results.get("extra_data", {}).get("status", "")
        lines = [f"labs grade-all: {results.get('score') or 0:g} points; {status}".rstrip("; ")]
        lines += [comment_line(t) for t in results.get("tests", [])]
        try:
            comment = gb.find_comment(module_cell_id(self.lab), nb, a, student)
            comment.auto_comment = "\n".join(lines)
        except api.MissingEntry:
            pass
        gb.db.commit()

    def close(self):
        self.gb.close()
