"""Every lab is complete, and `labs new` (harness.scaffold.new_lab) makes complete labs.

(a) For each lab in labs.yaml: the handout has the headings of "How a lab reads"; the
    stub, visible tests, reference, graders and mutants are there; the stub's finished
    helpers (top-level functions and classes raising no NotImplementedError, the marker
    ``_impl.solved_stub`` tells tasks by) are the reference's own source; the
    manifest entry names a title, an api the stub and reference define, and parts the
    graders mark.
(b) ``new_lab`` on a copy of the course: lab 99 is complete by (a), its stub scores 0
    and its reference full marks under ``harness.grading.grade``, its visible tests fail
    on the stub and pass on the reference, its mutant fails the graders.
(c) Its errors: a clear ScaffoldError naming the argument and value, nothing written.
"""
from __future__ import annotations

import ast
import difflib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import grading, impl as _impl, manifest, scaffold
from harness.errors import LabsError
from harness.scaffold import ScaffoldError, new_lab

from .conftest import ROOT, course

LABS = sorted(course().labs)

# "How a lab reads": the handout's level-2 headings, by the words they start with
HEADINGS = ["Quick start", "Packages", "Background", "The contract", "Parts", "Pitfalls",
            "How performance is measured"]
# what a submission may import (the lock's packages); the handout's Packages section names each
PACKAGES = ["torch", "numpy", "einops"]


# --- (a) completeness, over any course tree ---------------------------------------------------

def handout_problems(root: Path, lab: manifest.Lab) -> list[str]:
    path = root / "labs" / lab.number / "README.md"
    if not path.is_file():
        return [f"labs/{lab.number}/README.md is missing"]
    lines = path.read_text().splitlines()
    problems = []
    h1 = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if h1 is None or not lines[h1].startswith(f"# Lab {lab.number}") or lab.title.lower() not in lines[h1].lower():
        problems.append(f"no first heading '# Lab {lab.number} — {lab.title}'")
    h2 = [line[3:].strip() for line in lines if line.startswith("## ")]
    first_h2 = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    intro = "\n".join(lines[(h1 or 0) + 1:first_h2])
    if "goal" not in intro.lower() and "learn" not in intro.lower():
        problems.append("the introduction (before the first '## ') states no goal")
    if "learn" not in intro.lower():
        problems.append("the introduction (before the first '## ') says nothing of what you will learn")
    for want in HEADINGS:
        if not any(h.lower().startswith(want.lower()) for h in h2):
            problems.append(f"no '## {want}' heading")
    text = "\n".join(lines)
    packages = text.split("\n## Packages", 1)[1].split("\n## ", 1)[0] if "\n## Packages" in text else ""
    missing = [name for name in PACKAGES if f"`{name}`" not in packages]
    if packages and missing:
        problems.append(f"the '## Packages' section does not name {', '.join(missing)} (what a submission may import)")
    return problems


def file_problems(root: Path, lab: manifest.Lab) -> list[str]:
    n, f = lab.number, lab.filename
    want = {f"labs/{n}/{f}": (root / "labs" / n / f).is_file(),
            f"labs/{n}/test_*.py": any((root / "labs" / n).glob("test_*.py")),
            f"solutions/{n}/{f}": (root / "solutions" / n / f).is_file(),
            f"graders/{n}/test_*.py": any((root / "graders" / n).glob("test_*.py")),
            f"tests/mutants/{n}/*.py": any((root / "tests" / "mutants" / n).glob("*.py"))}
    return [f"{rel} is missing" for rel, there in want.items() if not there]


def _top_level(path: Path) -> tuple[str, dict[str, ast.AST]]:
    source = path.read_text()
    return source, {d.name: d for d in ast.parse(source).body
                    if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _source(source: str, node: ast.AST) -> str:
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "\n".join(source.splitlines()[first - 1:node.end_lineno])


def _is_task(node: ast.AST) -> bool:
    """A student's task: it raises NotImplementedError somewhere (as ``_impl.solved_stub`` reads it)."""
    return any(isinstance(n, ast.Raise) and n.exc is not None and "NotImplementedError" in ast.unparse(n.exc)
               for n in ast.walk(node))


def helper_problems(root: Path, lab: manifest.Lab) -> list[str]:
    stub_src, stub = _top_level(root / "labs" / lab.number / lab.filename)
    ref_src, ref = _top_level(root / "solutions" / lab.number / lab.filename)
    problems = []
    for name, node in stub.items():
        if _is_task(node):
            continue
        if name not in ref:
            problems.append(f"helper {name} (line {node.lineno}) is not in solutions/{lab.number}/{lab.filename}")
        elif _source(stub_src, node) != _source(ref_src, ref[name]):
            diff = difflib.unified_diff(_source(ref_src, ref[name]).splitlines(), _source(stub_src, node).splitlines(),
                                        "solution", "stub", lineterm="", n=0)
            problems.append(f"helper {name} differs from the solution's: " + " | ".join(list(diff)[2:8]))
    return problems


def _defines(path: Path, name: str) -> bool:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == name for t in targets):
            return True
    return False


def manifest_problems(root: Path, course_: manifest.Course, lab: manifest.Lab) -> list[str]:
    problems = []
    if not lab.title.strip():
        problems.append("title is empty")
    if not lab.api:
        problems.append("api lists no names")
    if not lab.parts:
        problems.append("parts lists no parts")
    for kind in ("labs", "solutions"):
        path = root / kind / lab.number / lab.filename
        missing = [n for n in lab.api if path.is_file() and not _defines(path, n)]
        if missing:
            problems.append(f"api names {', '.join(missing)}, not defined in {kind}/{lab.number}/{lab.filename}")
    graders = "\n".join(p.read_text() for p in (root / "graders" / lab.number).glob("*.py"))
    unmarked = [p for p in lab.parts if not re.search(rf"""part\(\s*["']{re.escape(p)}["']""", graders)]
    if unmarked:
        problems.append(f"no grader is marked part({', '.join(map(repr, unmarked))})")
    why = _impl.solved_stub(course_, lab)
    if why:
        problems.append(why)
    return problems


def check_lab(root: Path, course_: manifest.Course, lab: manifest.Lab) -> list[str]:
    problems = handout_problems(root, lab) + file_problems(root, lab)
    if not problems:
        problems += helper_problems(root, lab) + manifest_problems(root, course_, lab)
    return problems


@pytest.mark.parametrize("number", LABS)
def test_handout_has_the_required_headings(number):
    problems = handout_problems(ROOT, course().lab(number))
    assert not problems, f"labs/{number}/README.md: " + "; ".join(problems)


@pytest.mark.parametrize("number", LABS)
def test_stub_solution_graders_and_mutants_are_present(number):
    problems = file_problems(ROOT, course().lab(number))
    assert not problems, f"lab {number}: " + "; ".join(problems)


@pytest.mark.parametrize("number", LABS)
def test_stub_helpers_are_the_solutions_own(number):
    lab = course().lab(number)
    if file_problems(ROOT, lab):
        pytest.skip("stub or solution missing (see the presence test)")
    problems = helper_problems(ROOT, lab)
    assert not problems, (f"labs/{number}/{lab.filename}: " + "; ".join(problems)
                          + " (a finished helper students get must be the reference's own, or the reference "
                            "a student's code is graded beside is not the code they were given)")


@pytest.mark.parametrize("number", LABS)
def test_manifest_entry_is_complete(number):
    c = course()
    problems = manifest_problems(ROOT, c, c.lab(number))
    assert not problems, f"labs.yaml, lab {number}: " + "; ".join(problems)


# --- (b) new_lab on a copy of the course ------------------------------------------------------

COPIED = ["labs.yaml", "pyproject.toml", "labs", "solutions", "graders", "tests/mutants"]


def copy_course(dest: Path) -> Path:
    """The parts of the course new_lab and grading read, without caches or staff outputs."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", manifest.STAFF_DIR)
    for rel in COPIED:
        src, out = ROOT / rel, dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, out, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, out)
    return dest


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and manifest.STAFF_DIR not in p.parts}


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory):
    """``(root, before, written)``: a course copy, its files before, and what ``new_lab(root, "99", "demo")`` wrote."""
    root = copy_course(tmp_path_factory.mktemp("course"))
    before = snapshot(root)
    written = new_lab(root, "99", "demo")
    return root, before, written


def test_new_lab_writes_six_files_and_appends_the_entry(scaffolded):
    root, before, written = scaffolded
    rel = [p.relative_to(root).as_posix() for p in written]
    assert rel == ["labs/99/demo.py", "labs/99/README.md", "labs/99/test_demo.py", "solutions/99/demo.py",
                   "graders/99/test_demo.py", "tests/mutants/99/alpha_scales_x.py", "labs.yaml"]
    after = snapshot(root)
    assert sorted(set(after) - set(before)) == sorted(rel[:-1]), "new_lab wrote files it does not report"
    changed = [n for n in before if after[n] != before[n]]
    assert changed == ["labs.yaml"], f"new_lab changed existing files: {changed}"
    old, new = before["labs.yaml"].decode().splitlines(), after["labs.yaml"].decode().splitlines()
    ops = {op for op, *_ in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()}
    assert ops <= {"equal", "insert"}, "labs.yaml lost or changed lines (its comments and layout must stay)"
    c = manifest.load(root)
    lab = c.lab("99")
    assert (lab.title, lab.module, lab.api, list(lab.parts)) == ("Demo", "demo", ["scaled_add"], ["A"])
    assert {n: c.labs[n] for n in LABS} == {n: course().labs[n] for n in LABS}, "other labs changed"
    assert not [p for p in root.iterdir() if p.name.startswith(".labs-new")], "the staging folder was left behind"


def test_new_lab_is_complete(scaffolded):
    root = scaffolded[0]
    c = manifest.load(root)
    assert check_lab(root, c, c.lab("99")) == []


def test_new_lab_stub_fails_its_graders_and_reference_passes(scaffolded):
    root = scaffolded[0]
    c = manifest.load(root)
    lab = c.lab("99")
    stub = grading.grade(root / "labs", lab, c)
    assert stub.tests, "no grader test ran"
    assert stub.score == 0 and all(t.outcome == "failed" for t in stub.tests), \
        [(t.name, t.outcome) for t in stub.tests]
    assert all("NotImplementedError" in t.output for t in stub.tests), [t.output[:200] for t in stub.tests]
    ref = grading.grade(root / "solutions", lab, c)
    failed = [f"{t.name}: {t.output[:300]}" for t in ref.tests if t.outcome != "passed"]
    assert not failed, "reference fails its graders:\n" + "\n".join(failed)
    assert ref.score == pytest.approx(ref.max_score) == pytest.approx(lab.points) == pytest.approx(100)


# one interpreter (torch imported once) for three pytest runs: visible tests on the stub and
# on the reference, graders on the mutant; prints their exit codes as JSON
RUNS = r"""
import json, sys, pytest
root, mutant = sys.argv[1], sys.argv[2]
common = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir", root]
codes = [pytest.main([root + "/labs/99", *common]),
         pytest.main([root + "/labs/99", "--impl", "solution", *common]),
         pytest.main([root + "/graders/99", "--impl", mutant, "-x", *common])]
print("CODES", json.dumps([int(c) for c in codes]))
"""


def test_new_lab_visible_tests_and_mutant(scaffolded, tmp_path, monkeypatch):
    root = scaffolded[0]
    text = (root / "solutions/99/demo.py").read_text()
    for old, new in ast.literal_eval(ast.parse((root / "tests/mutants/99/alpha_scales_x.py").read_text()).body[1].value):
        assert text.count(old) == 1, f"the mutant's edit {old!r} does not occur exactly once in the reference"
        text = text.replace(old, new)
    (tmp_path / "99").mkdir()
    (tmp_path / "99" / "demo.py").write_text(text)
    monkeypatch.delenv("LABS_COURSE", raising=False)
    p = subprocess.run([sys.executable, "-c", RUNS, str(root), str(tmp_path)], cwd=root, capture_output=True,
                       text=True, timeout=300)
    codes = json.loads(p.stdout.rsplit("CODES", 1)[-1]) if "CODES" in p.stdout else None
    assert codes is not None, p.stdout[-3000:] + p.stderr[-2000:]
    assert codes[0] == 1 and "NotImplementedError" in p.stdout, "visible tests do not fail on the stub\n" + p.stdout[-3000:]
    assert codes[1] == 0, "visible tests fail on the reference\n" + p.stdout[-3000:]
    assert codes[2] == 1, "the mutant survives the graders\n" + p.stdout[-3000:]


# --- (c) errors: clear, and nothing written ---------------------------------------------------

@pytest.fixture
def small_course(tmp_path):
    """A course holding only labs.yaml (a tree may hold only some labs' folders)."""
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy2(ROOT / "labs.yaml", root / "labs.yaml")
    return root


@pytest.mark.parametrize("number", ["7", "100", "ab", "", " 07", 7])
def test_number_not_two_digits_is_refused(small_course, number):
    before = snapshot(small_course)
    with pytest.raises(ScaffoldError, match=rf"number must be two digits .*got {re.escape(repr(number))}") as e:
        new_lab(small_course, number, "demo")
    assert isinstance(e.value, LabsError) and e.value.hint
    assert snapshot(small_course) == before


@pytest.mark.parametrize("module", ["Demo", "kv-cache", "2x", "class", "", "test_demo", "dé"])
def test_module_not_a_valid_identifier_is_refused(small_course, module):
    before = snapshot(small_course)
    with pytest.raises(ScaffoldError, match=rf"module must .*got {re.escape(repr(module))}"):
        new_lab(small_course, "98", module)
    assert snapshot(small_course) == before


def test_existing_lab_is_refused(small_course):
    before = snapshot(small_course)
    with pytest.raises(ScaffoldError, match=r"number: lab 03 exists already in .*labs.yaml"):
        new_lab(small_course, "03", "demo")
    assert snapshot(small_course) == before


@pytest.mark.parametrize("folder", ["labs/98", "graders/98", "tests/mutants/98"])
def test_left_over_folder_is_refused_not_overwritten(small_course, folder):
    (small_course / folder).mkdir(parents=True)
    (small_course / folder / "keep.txt").write_text("mine")
    before = snapshot(small_course)
    with pytest.raises(ScaffoldError, match=rf"lab 98 exists already: .*{re.escape(folder)} is there"):
        new_lab(small_course, "98", "demo")
    assert snapshot(small_course) == before


def test_failed_write_leaves_nothing(small_course, monkeypatch):
    before = snapshot(small_course)
    real, calls = scaffold.os.rename, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 3:  # after labs/98 and solutions/98 are in place
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(scaffold.os, "rename", flaky)
    with pytest.raises(ScaffoldError, match="cannot write lab 98"):
        new_lab(small_course, "98", "demo")
    assert len(calls) == 3
    assert snapshot(small_course) == before
    assert sorted(p.name for p in small_course.iterdir()) == ["labs.yaml"], "parent folders were left behind"


def test_missing_manifest_is_a_manifest_error(tmp_path):
    with pytest.raises(manifest.ManifestError):
        new_lab(tmp_path, "98", "demo")
    assert list(tmp_path.iterdir()) == []


def test_entry_goes_into_the_labs_block_and_keeps_comments():
    text = ('# top comment\nname: X\nlabs:\n    "01":\n        title: A\n        module: a\n'
            '        api: [f]\n        parts: {A: {title: t, points: 1}}\n# trailing comment\nimages:\n  cpu: c\n')
    out = scaffold.append_entry(text, '"02":\n  title: B\n', Path("labs.yaml"))
    assert out == text.replace("# trailing comment", '\n    "02":\n      title: B\n# trailing comment')


def test_title_needing_quotes_reads_back_and_a_bad_title_is_refused(small_course):
    title = "MoE: routed # experts"
    written = new_lab(small_course, "98", "moe", title=title)
    assert manifest.load(small_course).lab("98").title == title
    assert (small_course / "labs/98/README.md").read_text().count(f"# Lab 98 — {title}") == 1
    assert all(p.is_file() for p in written)
    with pytest.raises(ScaffoldError, match=r"title must .*got 'a\\nb'"):
        new_lab(small_course, "97", "x", title="a\nb")
