"""Shared fixtures for the framework's own tests.

``toy_course`` builds a throwaway course (one tiny lab) so plugin and CLI
tests run in seconds; the real labs are exercised by ``test_labs.py``.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from harness import manifest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

TOY_YAML = """\
name: Toy course
labs:
  "07":
    title: Toy lab
    module: toy
    api: [add]
    parts:
      A: {title: Adding, points: 6}
      B: {title: Speed, points: 4}
    perf:
      add_vs_torch: {baseline: torch.add, full_credit: 1.0, zero_credit: 3.0, bands: 1}  # one band: 0.5 credit at 2.0
"""
TOY_STUB = '''\
def add(x, y=1):
    """Return x + y."""
    raise NotImplementedError("Part A: return x + y")
'''
TOY_SOLUTION = "def add(x, y=1):\n    return x + y\n"
TOY_GRADER = '''\
import pytest

@pytest.mark.part("A")
def test_adds(impl, seed):
    assert impl.add(seed, 2) == seed + 2, "add(x, 2) is not x + 2"

@pytest.mark.part("A")
@pytest.mark.points(2)
def test_default(impl):
    assert impl.add(3) == 4

@pytest.mark.part("A")
@pytest.mark.gpu
def test_on_gpu(impl):
    assert impl.add(1) == 2

@pytest.mark.part("B")
@pytest.mark.perf
def test_speed(impl, record_perf):
    assert impl.add(1) == 2
    record_perf("add_vs_torch", 2.0, note="toy")
'''


@pytest.fixture
def toy_course(tmp_path, monkeypatch) -> Path:
    """A course root with lab 07: stub, solution, graders (A: 3 tests, one GPU; B: one perf test)."""
    root = tmp_path / "course"
    files = {"labs.yaml": TOY_YAML, "labs/07/toy.py": TOY_STUB, "solutions/07/toy.py": TOY_SOLUTION,
             "graders/07/test_toy.py": TOY_GRADER, "labs/07/test_toy_visible.py": TOY_GRADER}
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    monkeypatch.delenv("LABS_COURSE", raising=False)
    return root


def course() -> manifest.Course:
    return manifest.load(ROOT)


def materialize_mutant(mutant: Path, lab: manifest.Lab, dest: Path) -> Path:
    """Write the mutant's module to ``dest/NN/<module>.py`` and return ``dest``.

    A mutant file is either a full module, or a docstring plus ``MUTATE = [(old,
    new), ...]``: source edits applied to the reference, each ``old`` occurring
    exactly once (so a mutant breaks loudly when the reference changes)."""
    text = mutant.read_text()
    tree = ast.parse(text)
    edits = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["MUTATE"]:
            edits = ast.literal_eval(node.value)
    if edits is not None:
        src = (ROOT / "solutions" / lab.number / lab.filename).read_text()
        for old, new in edits:
            n = src.count(old)
            assert n == 1, f"{mutant.name}: {old!r} occurs {n} times in the reference (want exactly 1)"
            src = src.replace(old, new)
        text = src
    out = dest / lab.number / lab.filename
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return dest
