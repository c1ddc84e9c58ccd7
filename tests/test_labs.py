"""Every lab's graders, proven both ways (design.md, "One lab, three implementations"):
the reference gets full runnable marks, the stub scores zero with every runnable test
failing, and every mutant in tests/mutants/NN fails at least one grader test (a mutant's
``SELECT``, a pytest ``-k`` expression, names the test(s) that kill it: only those run).
Visible tests: the stub fails them with NotImplementedError, the reference passes."""
import ast
import os
import subprocess

import pytest

from harness import forkserver, grading

from .conftest import ROOT, course, materialize_mutant

COURSE = course()
LABS = sorted(n for n in COURSE.labs if (ROOT / "graders" / n).is_dir())
MUTANTS = [pytest.param(n, p, id=f"{n}-{p.stem}")
           for n in LABS for p in sorted((ROOT / "tests" / "mutants" / n).glob("*.py"))]
VARIANTS = [pytest.param(n, p, id=f"{n}-{p.stem}")
            for n in LABS for p in sorted((ROOT / "tests" / "variants" / n).glob("*.py"))]


def pytest_run(*args, timeout=1800):
    """``python -m pytest args`` in the course root, forked from this process's warm grader
    (``harness.forkserver``: no torch import per run)."""
    code, out, timed_out = forkserver.run(["-p", "no:cacheprovider", *args], cwd=ROOT, env=dict(os.environ),
                                          timeout=timeout)
    assert not timed_out, f"pytest {' '.join(args)} ran past {timeout} s:\n{out[-2000:]}"
    return subprocess.CompletedProcess(args, code, out, "")


@pytest.mark.parametrize("number", LABS)
def test_reference_gets_full_runnable_marks(number):
    result = grading.grade(ROOT / "solutions", COURSE.lab(number), COURSE, seed=None)
    failed = [f"{t.name}: {t.output[:300]}" for t in result.tests if t.runnable and t.outcome != "passed"]
    assert not failed, "reference fails graders:\n" + "\n".join(failed)
    assert result.max_score == pytest.approx(COURSE.lab(number).points)
    assert result.score == pytest.approx(result.max_score_runnable + result.bonus_runnable)


@pytest.mark.parametrize("number", LABS)
def test_stub_scores_zero_and_fails_every_runnable_test(number):
    result = grading.grade(ROOT / "labs", COURSE.lab(number), COURSE)
    passed = [t.name for t in result.tests if t.outcome == "passed"]
    assert not passed, f"the stub passes {passed}: these tests check no behaviour"
    assert result.score == 0


@pytest.mark.parametrize("number", LABS)
def test_each_lab_has_at_least_six_mutants(number):
    assert len([m for m in MUTANTS if m.values[0] == number]) >= 6


@pytest.mark.parametrize("number, mutant", MUTANTS)
def test_mutant_fails_a_grader_test(number, mutant, tmp_path):
    """The mutant fails the graders (at its ``SELECT``ed tests), and the first failing test's
    message names its bug class: ``MESSAGE``, a fragment the message must contain."""
    doc = ast.get_docstring(ast.parse(mutant.read_text()))
    assert doc, f"{mutant.name}: say what the bug is in a docstring"
    message = _assigned(mutant, "MESSAGE", None)
    assert message, f"{mutant.name}: MESSAGE = '...' names the bug class the first failing message must say"
    impl = materialize_mutant(mutant, COURSE.lab(number), tmp_path)
    # SELECT (a pytest -k expression, optional): the grader test(s) that kill the mutant, so
    # CI does not first run every test before them; a selection that keeps no test exits 5
    select = _assigned(mutant, "SELECT", None)
    p = pytest_run(f"graders/{number}", "--impl", str(impl), "-x", "-q", "-p", "no:randomly",
                   *(["-k", select] if select else []))
    assert p.returncode == 1, f"mutant {mutant.name} survived the graders{f' -k {select!r}' if select else ''} " \
        f"(exit {p.returncode}):\n{p.stdout[-2000:]}"
    assert message in p.stdout, f"mutant {mutant.name}: the failing test's message does not say {message!r}:\n" \
        f"{p.stdout[-3000:]}"


def _assigned(path, name, default):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    return default


@pytest.mark.parametrize("number, variant", VARIANTS)
def test_variant_loses_points_only_where_it_differs(number, variant, tmp_path):
    """A variant (tests/variants/NN) is correct code written another way, or code that
    leaves one part undone: ``MAY_FAIL`` names what it may fail (``"part B"`` or a test
    function's name); every other runnable grader test must pass. ``BUG = True`` marks a
    real bug graded in one place: it must fail at least one test, all of them in
    ``MAY_FAIL``; ``MESSAGE``: the bug class every failing test's message names.
    ``SELECT`` (a pytest ``-k`` expression) limits the run to the tests at stake, to keep
    CI short."""
    doc = ast.get_docstring(ast.parse(variant.read_text()))
    assert doc, f"{variant.name}: say what is unusual about it in a docstring"
    may_fail = _assigned(variant, "MAY_FAIL", [])
    impl = materialize_mutant(variant, COURSE.lab(number), tmp_path)
    result = grading.grade(impl, COURSE.lab(number), COURSE, select=_assigned(variant, "SELECT", None))
    ran = [t for t in result.tests if t.runnable and t.outcome != "not run"]
    assert ran, f"{variant.name}: no grader test ran"
    unfair = [f"{t.name}: {t.output[:400]}" for t in ran if t.outcome != "passed"
              and f"part {t.part}" not in may_fail and t.name.split("[")[0] not in may_fail]
    assert not unfair, f"{variant.name} loses points on tests it does not break:\n" + "\n".join(unfair)
    if _assigned(variant, "BUG", False):
        assert any(t.outcome != "passed" for t in ran), f"{variant.name}: the bug fails no grader test"
    message = _assigned(variant, "MESSAGE", None)
    if message:
        vague = [f"{t.name}: {t.output[:300]}" for t in ran if t.outcome != "passed" and message not in t.output]
        assert not vague, f"{variant.name}: these messages do not say {message!r}:\n" + "\n".join(vague)


@pytest.mark.parametrize("number", LABS)
def test_visible_tests_fail_on_stub_and_pass_on_reference(number):
    stub = pytest_run(f"labs/{number}", "-q")
    assert stub.returncode == 1 and "NotImplementedError" in stub.stdout, stub.stdout[-2000:]
    ref = pytest_run(f"labs/{number}", "--impl", "solution", "-q")
    assert ref.returncode == 0, ref.stdout[-3000:]
