"""Similarity of a class's submissions of one lab: every pair of modules compared with
copydetect's winnowing fingerprints (Schleimer et al., 2003; names, functions and strings
tokenized away first, so renamed variables still match), with the lab's stub and the
handout's code snippets as boilerplate whose fingerprints never count.

Staff-only: ``labs similarity SUBMISSIONS/ --lab NN`` writes the HTML report and the CSV,
and the course server shows ``/staff/labs/NN/similarity`` over each student's newest
submission. A pair's score is the larger of its two similarities (the share of a
module's fingerprinted tokens found in the other): a small module copied into a larger
one is still found. Pairs are ranked by it; those at or over ``threshold`` are flagged.
"""
from __future__ import annotations

import csv
import io
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import classroom, grading
from ..errors import LabsError
from ..manifest import Course, Lab, LabPaths
from .db import Account, Submission

NOISE_T = 25      # copydetect's default: matches shorter than this many filtered characters never count
GUARANTEE_T = 30  # copydetect's default: matches this long are always found (window = guarantee - noise + 1)
THRESHOLD = 0.5   # a pair at or over this share of matched code is flagged
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


@dataclass
class Pair:
    """Two students' modules compared: ``sim_a``/``sim_b`` the share of each one's
    fingerprinted tokens matched in the other, ``slices_a``/``slices_b`` the matched
    regions (character offsets into each module's text)."""
    a: str
    b: str
    sim_a: float
    sim_b: float
    tokens: int
    slices_a: list[tuple[int, int]] = field(default_factory=list)
    slices_b: list[tuple[int, int]] = field(default_factory=list)

    @property
    def score(self) -> float:
        return max(self.sim_a, self.sim_b)


@dataclass
class Report:
    """Every pair, highest score first, the modules compared and what was left out."""
    lab: Lab
    pairs: list[Pair]
    sources: dict[str, str]
    skipped: dict[str, str]
    threshold: float

    @property
    def flagged(self) -> list[Pair]:
        return [p for p in self.pairs if p.score >= self.threshold]


def check_threshold(threshold: float) -> float:
    """``threshold`` if it is a share in (0, 1]; else a LabsError naming it."""
    if not 0 < threshold <= 1:
        raise LabsError(f"--threshold {threshold!r} is not a share of matched code in (0, 1]",
                        hint="e.g. --threshold 0.5")
    return threshold


def boilerplate(course: Course, lab: Lab) -> list[str]:
    """The texts whose fingerprints never count: the lab's stub and each fenced code
    snippet of its handout (README.md), as students received them."""
    paths = LabPaths.of(lab, course.root)
    texts = []
    stub = paths.stub
    if stub.is_file():
        texts.append(stub.read_text(encoding="utf-8", errors="replace"))
    handout = paths.handout
    if handout.is_file():
        texts += FENCE.findall(handout.read_text(encoding="utf-8", errors="replace"))
    return texts


def modules_in(submissions: Path, lab: Lab) -> tuple[dict[str, str], dict[str, str]]:
    """Each student's module in ``submissions`` (grade-all's layout: one folder or
    archive per student, the module found by the same rule), and the students left out
    with why (no module, an archive refused, several entries)."""
    if not submissions.is_dir():
        raise LabsError(f"submissions folder {submissions} is not a directory",
                        hint="pass a folder holding one folder or archive per student")
    found, skipped = {}, {}
    subs, _notes = classroom.discover(submissions)
    with tempfile.TemporaryDirectory(prefix="labs-similarity-") as tmp:
        for i, sub in enumerate(subs):
            if sub.stray or sub.ambiguous:
                skipped[sub.student] = "not one folder or archive of a student"
                continue
            try:
                module = grading.take(sub.path, lab, Path(tmp) / str(i))
            except LabsError as e:
                skipped[sub.student] = str(e)
                continue
            found[sub.student] = module.data.decode("utf-8", errors="replace")
    return found, skipped


def newest_modules(s: Session, lab: str) -> dict[str, str]:
    """Each student's newest submitted module of ``lab`` (graded or not), as text: what
    the similarity report compares. Staff accounts' submissions are left out."""
    newest: dict[str, Submission] = {}
    q = (select(Submission, Account).join(Account, Submission.account_id == Account.id)
         .where(Submission.lab == lab, Account.role == "student").order_by(Submission.created_at))
    for sub, acc in s.execute(q):
        newest[acc.name] = sub
    return {name: sub.blob.decode("utf-8", errors="replace") for name, sub in newest.items()}


def _fingerprint(name: str, text: str, boiler=None, window: int | None = None):
    from copydetect import CodeFingerprint
    return CodeFingerprint(f"{name}.py", NOISE_T, window or GUARANTEE_T - NOISE_T + 1, boilerplate=boiler,
                           language="python", fp=io.StringIO(text))


def compare(sources: dict[str, str], boiler: list[str], lab: Lab, *, threshold: float = THRESHOLD,
            skipped: dict[str, str] | None = None) -> Report:
    """Compare every pair of ``sources`` (student -> module text) with ``boiler``'s
    fingerprints removed: the report, pairs ranked by score (then by names)."""
    import numpy as np
    from copydetect import compare_files

    check_threshold(threshold)
    hashes = [h for text in boiler for h in _fingerprint("boilerplate", text, window=1).hashes]
    boiler_hashes = np.unique(np.array(hashes, dtype=np.int64))
    prints = {name: _fingerprint(name, text, boiler_hashes) for name, text in sorted(sources.items())}
    names = list(prints)
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            tokens, (sim_a, sim_b), (sl_a, sl_b) = compare_files(prints[a], prints[b])
            pairs.append(Pair(a, b, float(sim_a), float(sim_b), int(tokens), _spans(sl_a), _spans(sl_b)))
    pairs.sort(key=lambda p: (-p.score, p.a, p.b))
    return Report(lab, pairs, dict(sources), dict(skipped or {}), threshold)


def _spans(slices) -> list[tuple[int, int]]:
    if len(slices) == 0 or len(slices[0]) == 0:
        return []
    return [(int(s), int(e)) for s, e in zip(slices[0], slices[1])]


def marked(text: str, spans: list[tuple[int, int]]) -> list[tuple[str, bool]]:
    """``text`` cut into (chunk, matched) pieces by ``spans``: what the report shows side
    by side (the template escapes each chunk)."""
    out, at = [], 0
    for start, end in sorted(spans):
        start, end = max(start, at), min(end, len(text))
        if start > at:
            out.append((text[at:start], False))
        if end > start:
            out.append((text[start:end], True))
        at = max(at, end)
    if at < len(text):
        out.append((text[at:], False))
    return out


def write_csv(report: Report, path: Path) -> None:
    """One row per pair, ranked: rank, the two students, the score, both similarities,
    the matched tokens, whether it is flagged."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["rank", "student_a", "student_b", "score", "similarity_a", "similarity_b", "matched_tokens",
                    "flagged"])
        for rank, p in enumerate(report.pairs, 1):
            w.writerow([rank, p.a, p.b, f"{p.score:.4f}", f"{p.sim_a:.4f}", f"{p.sim_b:.4f}", p.tokens,
                        "yes" if p.score >= report.threshold else "no"])


def views(report: Report, shown: int = 20) -> list[dict]:
    """The pairs as the template shows them: rank, scores, and for the first ``shown``
    (and every flagged one) the two modules cut into matched and unmatched pieces."""
    rows = []
    for rank, p in enumerate(report.pairs, 1):
        row = {"rank": rank, "a": p.a, "b": p.b, "score": p.score, "sim_a": p.sim_a, "sim_b": p.sim_b,
               "tokens": p.tokens, "flagged": p.score >= report.threshold}
        if rank <= shown or row["flagged"]:
            row["code_a"] = marked(report.sources[p.a], p.slices_a)
            row["code_b"] = marked(report.sources[p.b], p.slices_b)
        rows.append(row)
    return rows


def write(report: Report, page: str, out: Path) -> tuple[Path, Path]:
    """``out/similarity.html`` (``page``: the report ``pages.similarity`` rendered,
    self-contained) and ``out/similarity.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    html, table = out / "similarity.html", out / "similarity.csv"
    html.write_text(page, encoding="utf-8")
    write_csv(report, table)
    return html, table
