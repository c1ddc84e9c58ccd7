"""Joins between the graders and labs.yaml, checked where they are made.

1. ``record_perf(name, ...)``: a name that is no perf key of the lab fails the test as
   a grader defect (``labs_infra``): grading fails, no full credit, no student 0.
2. ``part`` / ``perf(key)`` markers that name nothing in labs.yaml, and grader tests
   without a part, are collection errors.
3. The real labs: every perf key is recorded by exactly one perf test, marked
   ``perf(key)``.
4. Every labs.yaml field is read by some harness code.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import grading, manifest
from tests.conftest import ROOT, TOY_YAML

# the toy course with a second perf key, so "recorded the other key" can be written
TWO_KEYS_YAML = TOY_YAML + "      add_vs_numpy: {baseline: numpy.add, full_credit: 1.0, zero_credit: 3.0}\n"


def pytest_run(cwd: Path, *args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def by_name(results: Path) -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(results.read_text())["tests"]}


# --- 1. record_perf names a perf key of its lab -----------------------------------

def test_misspelled_record_perf_name_fails_grading_as_a_grader_defect(toy_course):
    grader = toy_course / "graders/07/test_toy.py"
    grader.write_text(grader.read_text().replace('record_perf("add_vs_torch"', 'record_perf("add_vs_torhc"'))
    course = manifest.load(toy_course)
    with pytest.raises(grading.InfraFailure) as e:  # not a score: neither full credit nor a 0
        grading.grade(toy_course / "solutions", course.lab("07"), course, seed=1)
    msg = str(e.value)
    assert msg.startswith("grading failed: graders/07/test_toy.py::test_speed: record_perf('add_vs_torhc'): "), msg
    assert "'add_vs_torhc' is not a perf key of lab 07 in labs.yaml" in msg
    assert "perf keys of lab 07 in labs.yaml: add_vs_torch" in msg


def test_record_perf_rules_fail_loudly_and_informational_figures_pass(toy_course, tmp_path):
    (toy_course / "labs.yaml").write_text(TWO_KEYS_YAML)
    (toy_course / "graders/07/test_joins.py").write_text('''\
import pytest

@pytest.mark.part("B")
@pytest.mark.perf("add_vs_torch")
def test_records_another_key(record_perf):
    record_perf("add_vs_numpy", 1.5)

@pytest.mark.part("B")
def test_graded_key_without_marker(record_perf):
    record_perf("add_vs_torch", 1.5)

@pytest.mark.part("B")
@pytest.mark.perf("add_vs_torch")
def test_twice(record_perf):
    record_perf("add_vs_torch", 1.5)
    record_perf("add_vs_torch", 1.0)

@pytest.mark.part("B")
@pytest.mark.perf("add_vs_numpy")
def test_never_records(record_perf):
    pass

@pytest.mark.part("A")
@pytest.mark.points(0)
def test_informational(record_perf):
    record_perf("add_peak_bytes", 3.0)
''')
    results = tmp_path / "r.json"
    rc, out = pytest_run(toy_course, "graders/07", "--impl", "solution", "--labs-results", str(results))
    assert rc == 1, out
    tests = by_name(results)
    want = {
        "test_records_another_key": "record_perf('add_vs_numpy'): the test's marker is "
                                    "@pytest.mark.perf('add_vs_torch'), which it must record",
        "test_graded_key_without_marker": "'add_vs_torch' is a graded perf key of lab 07 but the test has no perf "
                                          "marker: mark it @pytest.mark.perf('add_vs_torch')",
        "test_twice": "record_perf('add_vs_torch'): recorded twice",
        "test_never_records": "a perf test of lab 07 passed without calling record_perf('add_vs_numpy')",
    }
    for name, text in want.items():
        t = tests[name]
        assert t["outcome"] == "failed" and text in t["message"] and text in t["infra"], (name, t)
        assert t["message"].startswith("grader defect, grading failed (not the submission's fault): "), t["message"]
        assert f"_ {name} _" in out and text in out  # on the terminal too, in full
    info = tests["test_informational"]
    assert info["outcome"] == "passed" and info["infra"] is None and info["perf"][0]["name"] == "add_peak_bytes"
    speed = tests["test_speed"]  # the toy's own bare-marker perf test: still fine
    assert speed["outcome"] == "passed" and speed["perf_test"] and speed["perf_key"] is None
    assert tests["test_records_another_key"]["perf_key"] == "add_vs_torch"
    assert not tests["test_default"]["perf_test"]
    raw = json.loads(results.read_text())
    assert grading.infra_failure(raw).startswith("graders/07/test_joins.py::")  # what `labs grade` raises on


# --- 2. part and perf markers checked at collection ----------------------------------

def test_unknown_part_missing_part_and_unknown_perf_key_are_collection_errors(toy_course, tmp_path):
    files = {
        "graders/07/test_bad_part.py": "import pytest\n\n@pytest.mark.part('Z')\ndef test_z(impl):\n    pass\n",
        "graders/07/test_no_part.py": "def test_nothing(impl):\n    pass\n",
        "graders/07/test_bad_perf.py": ("import pytest\n\n@pytest.mark.part('B')\n@pytest.mark.perf('add_vs_tourch')"
                                        "\ndef test_p(record_perf):\n    record_perf('add_vs_tourch', 1.0)\n"),
        "graders/07/test_module_part.py": ("import pytest\npytestmark = pytest.mark.part('C')\n\n"
                                           "class TestIt:\n    def test_m(self):\n        pass\n"),
        "labs/07/test_visible_bad.py": "import pytest\n\n@pytest.mark.part('Q')\ndef test_q():\n    pass\n",
        "labs/07/test_visible_ok.py": "def test_no_part_is_fine_in_a_visible_test():\n    pass\n",
    }
    for rel, text in files.items():
        (toy_course / rel).write_text(text)
    results = tmp_path / "r.json"
    rc, out = pytest_run(toy_course, "graders/07", "labs/07", "--collect-only", "--labs-results", str(results))
    assert rc == 2, out  # collection errors, as with --strict-markers
    errors = json.loads(results.read_text())["errors"]
    assert len(errors) == 5, errors  # the four bad grader modules and the bad visible one
    expected = [
        "graders/07/test_bad_part.py::test_z: part 'Z' is not a part of lab 07 in labs.yaml (its parts: A, B)",
        "graders/07/test_no_part.py::test_nothing: no part marker: every grader test of lab 07 needs "
        "@pytest.mark.part(NAME), NAME one of the parts of lab 07 in labs.yaml: A, B",
        "graders/07/test_bad_perf.py::test_p: perf marker names 'add_vs_tourch', not a perf key of lab 07 in "
        "labs.yaml (its perf keys: add_vs_torch)",
        "graders/07/test_module_part.py::TestIt::test_m: part 'C' is not a part of lab 07",
        "labs/07/test_visible_bad.py::test_q: part 'Q' is not a part of lab 07",
    ]
    for text in expected:
        assert any(text in e for e in errors), (text, errors)
        assert text in out, text
    assert "test_no_part_is_fine_in_a_visible_test" in out and "test_speed" in out  # the rest is collected
    with pytest.raises(grading.GradingError, match="graders failed to collect: .*labs: graders/07/"):
        course = manifest.load(toy_course)
        grading.run(course, course.lab("07"), toy_course / "solutions", tmp_path / "g.json", 1)


# --- 3. the real labs: one perf test per perf key -----------------------------------

def test_every_perf_key_of_the_real_labs_is_recorded_by_exactly_one_marked_perf_test(tmp_path):
    results = tmp_path / "collected.json"
    rc, out = pytest_run(ROOT, str(ROOT / "graders"), "--collect-only", "--labs-results", str(results),
                         "--rootdir", str(ROOT), "-o", "addopts=--import-mode=importlib")
    raw = json.loads(results.read_text())
    assert rc == 0 and not raw["errors"], out[-3000:]
    course = manifest.load(ROOT)
    problems = []
    for num, lab in sorted(course.labs.items()):
        tests = [t for t in raw["tests"] if t["nodeid"].startswith(f"graders/{num}/")]
        assert tests, f"lab {num}: no grader tests collected"
        perf_tests = [t for t in tests if t["perf_test"]]
        for t in perf_tests:
            if t["perf_key"] is None:
                problems.append(f"{t['nodeid']}: perf test without a key: mark it @pytest.mark.perf(KEY)")
        for key in lab.perf:
            recorders = [t["nodeid"] for t in perf_tests if t["perf_key"] == key]
            if len(recorders) != 1:
                problems.append(f"lab {num} perf key {key!r} is recorded by {len(recorders)} perf tests: {recorders}")
        problems += [f"{t['nodeid']}: part {t['part']!r}" for t in tests if t["part"] not in lab.parts]
    assert not problems, "\n".join(problems)


# --- 4. every manifest field is read by some code ---------------------------------

def test_every_manifest_field_is_read_outside_the_manifest():
    sources = "\n".join(p.read_text() for p in sorted((ROOT / "harness").rglob("*.py"))
                        if p.name != "manifest.py" and "__pycache__" not in p.parts)
    models = [manifest.Course, manifest.Images, manifest.Lab, manifest.Part, manifest.PerfThreshold,
              manifest.Limits]
    unread = [f"{m.__name__}.{f}" for m in models for f in m.model_fields
              if not re.search(rf"\.{f}\b|\[['\"]{f}['\"]\]", sources)]
    assert not unread, f"labs.yaml fields no harness code reads (wire or remove them): {unread}"
    assert "world_sizes" not in manifest.Lab.model_fields
