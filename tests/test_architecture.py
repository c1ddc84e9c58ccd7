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
    ("harness/plugin.py", "sandbox"),
    ("harness/plugin.py", "distributed"), ("harness/plugin.py", "progress"),
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
