"""The harness's layers hold: `lint-imports` (pyproject.toml [tool.importlinter]) keeps
the layer and terminal contracts, and no harness module hides an import of another
inside a function, which is how import cycles stayed invisible before."""
import ast
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT

# (module, imported): the only function-level imports of harness modules, each for a reason
LAZY = {
    # the pytest11 entry point loads in every pytest run of the environment: it imports
    # the sandbox (torch), the ranks and the progress store only when a lab is tested
    ("harness/plugin.py", "sandbox"), ("harness/plugin.py", "progress"),
    # the staff CLI loads the course server (FastAPI, SQLAlchemy, Celery: +0.5 s) only for
    # its own commands, not for every `labs` call
    ("harness/cli/server.py", "server"), ("harness/cli/runner.py", "server"),
    # the warm grader's own process starts the sandbox's zygote (the sandbox imports torch), not
    # every process that imports forkserver to ask it for a run
    ("harness/forkserver.py", "sandbox"),
}


def _function_level_imports(path: Path):
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level:
                yield fn.name, node.lineno, ".".join(filter(None, [node.module] + (
                    [node.names[0].name] if not node.module else [])))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness"):
                yield fn.name, node.lineno, node.module.removeprefix("harness").lstrip(".")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("harness"):
                        yield fn.name, node.lineno, a.name.removeprefix("harness").lstrip(".")


def test_no_harness_import_hides_inside_a_function():
    found = [(p.relative_to(ROOT).as_posix(), name, fn, line)
             for p in sorted((ROOT / "harness").rglob("*.py")) for fn, line, name in _function_level_imports(p)]
    hidden = [f"{path}:{line} in {fn}(): import of {name}" for path, name, fn, line in found
              if (path, name) not in LAZY]
    assert not hidden, "import at the top of the module (or add to LAZY, with the reason):\n" + "\n".join(hidden)
    assert {(path, name) for path, name, _, _ in found} == LAZY, "LAZY lists an import that is gone"


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    p = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "0 broken" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]


def test_no_import_cycle_between_harness_modules():
    """No harness module imports one that imports it back, however indirectly (grimp's
    graph, as lint-imports reads it; a package imports its modules, never the reverse)."""
    import grimp
    graph = grimp.build_graph("harness", cache_dir=None)
    cycles = []
    for m in sorted(x for x in graph.modules if x.startswith("harness")):
        for imported in sorted(graph.find_modules_directly_imported_by(m)):
            chain = (m,) if imported == m else graph.find_shortest_chain(importer=imported, imported=m)
            if chain is not None:
                cycles.append(" -> ".join((m, *chain)))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _grader_side_files():
    """Every hidden grader and every visible test (with their conftest.py): the toolkit's users."""
    return sorted({*(ROOT / "graders").rglob("*.py"), *(ROOT / "labs").glob("*/test_*.py"),
                   *(ROOT / "labs").glob("*/conftest.py")})


def _harness_imports(path: Path):
    """(line, module) for each import of a harness module in ``path``, top-level or in a function;
    ``from harness import x`` counts as ``harness.x``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "harness":
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "harness":
            if node.module == "harness":
                for a in node.names:
                    yield node.lineno, f"harness.{a.name}"
            else:
                yield node.lineno, node.module
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and node.args[0].value.split(".")[0] == "harness"
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            yield node.lineno, node.args[0].value


def test_graders_and_visible_tests_import_only_the_toolkit():
    """harness/toolkit.py is the one seam between the graders (and visible tests) and the harness:
    a name they need is re-exported there, so the modules behind it can move without them."""
    files = _grader_side_files()
    found = [(p.relative_to(ROOT).as_posix(), line, mod) for p in files for line, mod in _harness_imports(p)]
    other = [f"{path}:{line}: imports {mod}" for path, line, mod in found if mod != "harness.toolkit"]
    assert not other, "graders and visible tests import only harness.toolkit (re-export the name there):\n" + \
        "\n".join(other)
    assert found, "no grader or visible test imports the toolkit: the walk is wrong"


def test_every_visible_test_of_the_course_names_its_part():
    """`labs progress` reports visible tests by part and `-k part_a` selects by it: every
    visible test of the course's labs carries a part marker (the plugin checks it names
    a part of the lab)."""
    unmarked = []
    for path in sorted(ROOT.glob("labs/*/test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and not any(
                    "part" in ast.unparse(d) for d in node.decorator_list):
                unmarked.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert not unmarked, "add @pytest.mark.part(NAME):\n" + "\n".join(unmarked)


def test_no_bare_pytest_raises_in_graders_or_visible_tests():
    """A failed `pytest.raises` says only "DID NOT RAISE": graders and visible tests use
    `expect_raises`, whose message names the case and the error expected."""
    bare = [f"{p.relative_to(ROOT).as_posix()}:{node.lineno}" for p in _grader_side_files()
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.Attribute) and node.attr == "raises" and ast.unparse(node.value) == "pytest"]
    assert not bare, "use harness.toolkit.expect_raises(exc, case, fn, *args) instead of pytest.raises:\n" + \
        "\n".join(bare)
