"""Resolve and load one implementation of a lab: student stub, reference, or a submission.

``--impl student`` is ``labs/NN``, ``--impl solution`` is ``solutions/NN`` and
``--impl PATH`` is any directory holding ``NN/<module>.py`` or
``labs/NN/<module>.py`` (a submission or a student's checkout). Modules are
loaded by path under a private name, so the stub, the reference and a
submission can live in one process, and spawned ranks can load the same file.
The contract (the stub) fixes the names the graders use and how they call them:
a missing name or a call the implementation's signature does not bind fails the
test that makes it, with :class:`APIMismatch` naming the call and both signatures
(:func:`missing_names`, :func:`unbound_call`); nothing else is charged.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType

from .manifest import Course, Lab, LabPaths
from .errors import LabsError

ALIASES = {"student": "labs", "solution": "solutions"}


class ImplError(LabsError):
    """The implementation cannot be found, imported, or does not match the contract."""


def impl_root(spec: str, course: Course, cwd: Path | None = None) -> Path:
    """Directory under which ``NN/<module>.py`` lives for ``spec``."""
    if spec in ALIASES:
        return course.root / ALIASES[spec]
    p = Path(spec)
    if not p.is_absolute():
        p = (cwd or Path.cwd()) / p
    p = p.resolve()
    if not p.is_dir():
        raise ImplError(f"--impl {spec}: no such directory")
    return p


SKIP_NAMES = frozenset({"__MACOSX", "__pycache__", ".ipynb_checkpoints", "venv", "node_modules"})  # and .hidden


def locate(root: Path, lab: Lab) -> Path:
    """The lab's module file in ``root`` (a checkout, an ``NN/`` folder, an unpacked
    upload): the one rule of ``labs grade``, ``labs grade-all``, the Gradescope
    autograder, nbgrader's collected modules and ``--impl``. In order:
    ``labs/NN/<module>.py``, ``NN/<module>.py``, ``<module>.py`` at the top, else the
    shallowest ``<module>.py`` anywhere below (archives often wrap a folder), skipping
    hidden folders, ``__MACOSX``, ``__pycache__`` and virtual environments.

    Raises ImplError naming ``root`` and the rule when there is none, and naming the
    files when two or more lie equally shallow (which one is the submission is the
    student's to say, never ours to guess)."""
    root, rel = Path(root), LabPaths.of(lab)
    for c in (LabPaths.of(lab, root).stub, rel.in_impl(root), root / lab.filename):
        if c.is_file():
            return c
    found: list[Path] = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in SKIP_NAMES)
        if lab.filename in files and os.path.isfile(os.path.join(d, lab.filename)):
            found.append(Path(d) / lab.filename)
    if not found:
        raise ImplError(f"no {lab.filename} in {root} (looked at {rel.stub}, {rel.in_impl('')}, "
                        f"{lab.filename} and every folder below)")
    depth = lambda p: len(p.relative_to(root).parts)
    best = sorted(p for p in found if depth(p) == min(map(depth, found)))
    if len(best) > 1:
        raise ImplError(f"{len(best)} files named {lab.filename} equally deep in {root}: "
                        + ", ".join(p.relative_to(root).as_posix() for p in best[:5])
                        + f"; keep one, or put yours at {rel.stub}")
    return best[0]


def load_module(path: Path | str) -> ModuleType:
    """Import the file at ``path`` under a private, path-derived name.

    Cached in ``sys.modules`` so that each file is imported once per process.
    Raises ImplError with the exception type, message and line for a file
    that fails to import (syntax errors included).
    """
    path = Path(path).resolve()
    name = "labimpl_" + path.stem + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:10]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException as e:  # SystemExit from a submission must not end the run
        del sys.modules[name]
        where = ""
        if isinstance(e, SyntaxError):
            where = f" (line {e.lineno})"
        else:
            tb = e.__traceback__
            while tb is not None:
                if Path(tb.tb_frame.f_code.co_filename).resolve() == path:
                    where = f" (line {tb.tb_lineno})"
                tb = tb.tb_next
        raise ImplError(f"importing {path.name} failed{where}: {type(e).__name__}: {e}") from None
    return mod


class APIMismatch(AssertionError):
    """A grader's use of the contract the implementation does not accept: a contract name it
    lacks, or a call whose arguments its signature does not bind. Only the test making that
    use fails (the contract fixes the names the graders use and how they call them, nothing
    more: extra optional parameters, other defaults, ``*args``/``**kwargs`` are fine)."""


def missing_names(mod: ModuleType, lab: Lab) -> dict[str, str]:
    """The lab's api names ``mod`` lacks, each with the message a test using it fails with."""
    return {name: f"api mismatch: {name} is missing (the lab {lab.number} contract requires it)"
            for name in lab.api if not hasattr(mod, name)}


def _signature(fn) -> inspect.Signature | None:
    """``fn``'s signature without annotations (what a message shows), or None."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    empty = inspect.Parameter.empty
    return sig.replace(parameters=[p.replace(annotation=empty) for p in sig.parameters.values()],
                       return_annotation=empty)


def _shape(args, kwargs) -> str:
    name = lambda v: type(v).__name__
    return "(" + ", ".join([name(a) for a in args] + [f"{k}={name(v)}" for k, v in kwargs.items()]) + ")"


def unbound_call(fn, args, kwargs, contract: ModuleType | None = None) -> str | None:
    """Why ``fn(*args, **kwargs)`` cannot bind ``fn``'s signature (the call would fail before
    running any of ``fn``), naming the call and, when ``contract`` (the stub) defines the same
    qualified name, the contract's signature; None when it binds or has no signature."""
    sig = _signature(fn)
    if sig is None:
        return None
    try:
        sig.bind(*args, **kwargs)
        return None
    except TypeError as e:
        why = str(e)
    qual = getattr(fn, "__qualname__", getattr(fn, "__name__", "the function"))
    want = contract
    for part in qual.split("."):
        want = getattr(want, part, None) if want is not None else None
    want_sig = _signature(want) if want is not None else None
    return (f"api mismatch: the graders call {qual}{_shape(args, kwargs)}, which {qual}{sig} does not accept "
            f"({why})" + (f"; the contract's is {qual}{want_sig}" if want_sig is not None else ""))


# --- is a stub a stub (labs release, labs nbgrader export) ----------------------

def _defs(source: str) -> dict[str, ast.AST]:
    return {d.name: d for d in ast.parse(source).body
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _raises_not_implemented(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Raise) and n.exc is not None and "NotImplementedError" in ast.unparse(n.exc)
               for n in ast.walk(node))


def _methods(node: ast.AST) -> dict[str, ast.AST]:
    return {d.name: d for d in getattr(node, "body", []) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}


def solved_stub(course: Course, lab: Lab) -> str | None:
    """Why ``labs/NN/<module>.py`` is not a stub students may get, or None when it is one.

    Every task (``Lab.tasks``: the api names not ``given``) raises
    ``NotImplementedError`` in the stub; in a task class, every method does (a helper
    method is part of the task), but for the ``given`` ``Class.method`` ones. Every
    ``given`` name or method is the reference's own definition. So the reference
    itself, a stub solved by hand, and a stub with one task or one method filled in (by
    hand or with the reference's text) while the others remain are all refused."""
    paths = course.paths(lab)
    stub_path, ref_path, rel = paths.stub, paths.reference, paths.relative.stub
    try:
        stub = _defs(stub_path.read_text())
        ref = _defs(ref_path.read_text()) if ref_path.is_file() else {}
    except (OSError, SyntaxError, ValueError) as e:
        return f"{rel} cannot be checked: {type(e).__name__}: {e}"
    solved, given = [], [(n, stub.get(n), ref.get(n)) for n in lab.given if "." not in n]
    for n in lab.tasks:
        if n not in stub:
            continue
        if not isinstance(stub[n], ast.ClassDef):
            solved += [] if _raises_not_implemented(stub[n]) else [n]
            continue
        kept = lab.given_methods(n)
        methods, ref_methods = _methods(stub[n]), _methods(ref.get(n))
        solved += [f"{n}.{m}" for m, d in methods.items() if m not in kept and not _raises_not_implemented(d)]
        given += [(f"{n}.{m}", methods.get(m), ref_methods.get(m)) for m in kept]
        if not methods and not _raises_not_implemented(stub[n]):
            solved.append(n)
    if solved:
        methods = any("." in n for n in solved)
        return (f"{rel} looks solved: {', '.join(solved)} raise(s) no NotImplementedError (task(s) of labs.yaml's "
                f"api{'; a method the stub gives finished is listed in given as Class.method' if methods else ''})")
    changed = [n for n, mine, theirs in given if ref and (n.split(".")[0] in stub)   # without a reference: tasks only
               and (mine is None or theirs is None or ast.dump(mine) != ast.dump(theirs))]
    if changed:
        return f"{rel}: given {', '.join(changed)} differ(s) from the reference's definition (labs.yaml given)"
    return None
