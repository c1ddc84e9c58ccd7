"""``labs new NN --module NAME``: scaffold lab NN from ``templates/lab/``.

A new lab is six things that must agree (design.md, "One lab, three
implementations"), written together from templates holding one demo task,
``scaled_add``, so the new lab passes the framework's own checks from its first
commit: the stub fails its graders, the reference passes them, the mutant fails.

=====================================  ==========================
``labs/NN/<module>.py``                the stub   (``stub.py.tmpl``)
``labs/NN/README.md``                  the handout (``README.md.tmpl``)
``labs/NN/test_<module>.py``           visible tests (``test_visible.py.tmpl``)
``solutions/NN/<module>.py``           the reference (``solution.py.tmpl``)
``graders/NN/test_<module>.py``        hidden graders (``grader.py.tmpl``)
``tests/mutants/NN/alpha_scales_x.py`` a mutant (``mutant.py.tmpl``, MUTATE edits)
``labs.yaml``                          the entry, appended to the ``labs:`` block
                                       (``labs.yaml.tmpl``; comments and layout kept)
=====================================  ==========================

The steps, in order; nothing is written until the first three have passed:

1. ``check``    the arguments, and that neither ``labs.yaml`` nor any of the four
                folders knows lab NN;
2. ``render``   every file from its template, the Python ones compiled;
3. ``entry``    the new ``labs.yaml`` text, re-parsed and validated as a course
                whose other labs are unchanged;
4. ``write``    everything into a temporary folder under the course root, then
                each new folder renamed into place and ``labs.yaml`` replaced
                last; any failure removes what was moved: all files or none.
"""
from __future__ import annotations

import json
import keyword
import os
import re
import shutil
import string
import tempfile
from pathlib import Path

import yaml
from pydantic import ValidationError

from . import manifest
from .manifest import LabPaths
from .errors import LabsError

TEMPLATES = Path(__file__).resolve().parent / "templates" / "lab"
MUTANT = "alpha_scales_x.py"


class ScaffoldError(LabsError):
    """``labs new`` refused its arguments or could not write; nothing was written.
    The message (one line) names the argument and its value, ``hint`` what to do;
    exit code ``USAGE``."""


def lab_files(number: str, module: str) -> dict[str, str]:
    """Course-relative path of each file a new lab gets -> the template it comes from."""
    paths = LabPaths(Path(), number, f"{module}.py")
    return {paths.stub.as_posix(): "stub.py.tmpl",
            paths.handout.as_posix(): "README.md.tmpl",
            (paths.folder / f"test_{module}.py").as_posix(): "test_visible.py.tmpl",
            paths.reference.as_posix(): "solution.py.tmpl",
            (paths.graders / f"test_{module}.py").as_posix(): "grader.py.tmpl",
            (paths.mutants / MUTANT).as_posix(): "mutant.py.tmpl"}


def _folders(number: str) -> list[str]:
    return [p.as_posix() for p in LabPaths(Path(), number, "").folders]


# --- step 1: check ------------------------------------------------------------------

def _check_args(number, module, title) -> str:
    if not isinstance(number, str) or not re.fullmatch(r"\d\d", number):
        raise ScaffoldError(f"number must be two digits such as '07', got {number!r}",
                            hint="pass the lab number with its leading zero")
    if not isinstance(module, str) or not re.fullmatch(r"[a-z_][a-z0-9_]*", module) or keyword.iskeyword(module):
        raise ScaffoldError(f"module must be a lower-case Python identifier such as 'kv_cache', got {module!r}",
                            hint="use letters, digits and underscores, not a Python keyword")
    if module.startswith("test"):
        raise ScaffoldError(f"module must not start with 'test' (pytest would collect it), got {module!r}",
                            hint="name the module after what the lab builds")
    if title is None:
        title = module.replace("_", " ").capitalize()
    if not isinstance(title, str) or not title.strip() or not title.isprintable() or '"""' in title \
            or "\\" in title:
        raise ScaffoldError(f"title must be one printable line without backslashes or triple quotes, got {title!r}",
                            hint="pass a short title such as 'KV cache'")
    return title.strip()


def _check_new(root: Path, course: manifest.Course, number: str) -> None:
    if number in course.labs:
        lab = course.labs[number]
        raise ScaffoldError(f"number: lab {number} exists already in {root / manifest.MANIFEST} "
                            f"({lab.title!r}, module {lab.module!r})",
                            hint=f"pick a free number; taken: {', '.join(sorted(course.labs))}")
    for rel in _folders(number):
        if os.path.lexists(root / rel):
            raise ScaffoldError(f"number: lab {number} exists already: {root / rel} is there",
                                hint=f"pick a free number, or remove {rel} if it is left over")


# --- step 2: render -----------------------------------------------------------------

def _yaml_scalar(text: str) -> str:
    """``text`` as a YAML scalar: plain where it reads back as itself, else double-quoted."""
    try:
        if yaml.safe_load(text) == text:
            return text
    except yaml.YAMLError:
        pass
    return json.dumps(text)   # a JSON string is a YAML double-quoted scalar


def _template(name: str, values: dict[str, str]) -> str:
    try:
        return string.Template((TEMPLATES / name).read_text()).substitute(values)
    except (OSError, KeyError, ValueError) as e:
        raise ScaffoldError(f"template {TEMPLATES / name} cannot be rendered: {type(e).__name__}: {e}",
                            hint="reinstall the harness package (its templates ship as package data)") from None


def render(number: str, module: str, title: str) -> tuple[dict[str, str], str]:
    """``(files, entry)``: every new file's text (course-relative path -> text), the Python
    ones compiled, and the lab's ``labs.yaml`` entry (at column 0). Raises ScaffoldError
    when a template is missing or renders to invalid Python."""
    values = {"number": number, "module": module, "title": title, "title_yaml": _yaml_scalar(title)}
    files = {}
    for rel, name in lab_files(number, module).items():
        text = _template(name, values)
        if rel.endswith(".py"):
            try:
                compile(text, rel, "exec")
            except SyntaxError as e:
                raise ScaffoldError(f"template {name} renders to invalid Python for {rel}: {e}") from None
        files[rel] = text
    return files, _template("labs.yaml.tmpl", values)


# --- step 3: entry ------------------------------------------------------------------

def append_entry(text: str, entry: str, path: Path) -> str:
    """``text`` (a ``labs.yaml``) with ``entry`` (a lab's YAML at column 0) added as the last
    lab of the top-level ``labs:`` block mapping, indented like the labs already there,
    after a blank line; every other line (comments included) kept as it is."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(r"labs:\s*(#.*)?$", line)), None)
    if start is None:
        raise ScaffoldError(f"{path}: no top-level `labs:` block mapping to append to",
                            hint="write `labs:` on its own line, one lab per indented key")
    end, indent = start + 1, None   # end: one past the block's last content line
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            break
        end = i + 1
        if indent is None:
            indent = line[:len(line) - len(line.lstrip())]
    indent = indent or "  "
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    block = "".join(indent + line if line.strip() else line for line in entry.splitlines(keepends=True))
    return "".join(lines[:end]) + "\n" + block + "".join(lines[end:])


def _new_manifest(root: Path, number: str, entry: str) -> tuple[str, str]:
    """``(old, new)`` text of ``labs.yaml``; the new one parsed and validated as a course
    holding lab ``number`` and, otherwise, exactly the labs of the old one."""
    path = root / manifest.MANIFEST
    old = path.read_text()
    new = append_entry(old, entry, path)
    try:
        before, after = yaml.safe_load(old), yaml.safe_load(new)
        manifest.Course(**after, root=root)
    except (yaml.YAMLError, TypeError, ValidationError) as e:
        raise ScaffoldError(f"{path}: appending lab {number} gives an invalid manifest: {' '.join(str(e).split())[:500]}",
                            hint=f"check the layout of the `labs:` block in {path.name}") from None
    labs_before = dict(before.get("labs") or {})
    if {str(k): v for k, v in after["labs"].items() if str(k) != number} != \
            {str(k): v for k, v in labs_before.items()} or number not in after["labs"]:
        raise ScaffoldError(f"{path}: appending lab {number} would change other labs (an unusual `labs:` layout)",
                            hint=f"add the entry by hand: {entry.splitlines()[0]} ...")
    return old, new


# --- step 4: write ------------------------------------------------------------------

def _write(root: Path, number: str, files: dict[str, str], old: str, new: str) -> None:
    try:
        stage = Path(tempfile.mkdtemp(dir=root, prefix=f".labs-new-{number}-"))
    except OSError as e:
        raise ScaffoldError(f"cannot write lab {number} under {root}: {e}",
                            hint="nothing was written; fix the permissions or free space and run it again") from None
    moved: list[Path] = []     # new folders renamed into place, removed again on failure
    made: list[Path] = []      # parents created for them (tests/mutants in a bare course)
    target = root / manifest.MANIFEST
    try:
        for rel, text in files.items():
            p = stage / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        (stage / manifest.MANIFEST).write_text(new)
        shutil.copymode(target, stage / manifest.MANIFEST)
        for rel in _folders(number):
            dest = root / rel
            for parent in reversed(dest.parents):
                if parent != root and root in parent.parents and not parent.exists():
                    parent.mkdir()
                    made.append(parent)
            if os.path.lexists(dest):  # appeared since step 1: never overwrite
                raise ScaffoldError(f"number: lab {number} exists already: {dest} appeared while scaffolding")
            os.rename(stage / rel, dest)
            moved.append(dest)
        if target.read_text() != old:
            raise ScaffoldError(f"{target} changed while scaffolding lab {number}", hint="run it again")
        os.replace(stage / manifest.MANIFEST, target)
    except BaseException as e:
        for dest in reversed(moved):
            shutil.rmtree(dest, ignore_errors=True)
        for parent in reversed(made):
            try:
                parent.rmdir()
            except OSError:
                pass
        if isinstance(e, OSError):
            raise ScaffoldError(f"cannot write lab {number} under {root}: {e}",
                                hint="nothing was written; fix the permissions or free space and run it again") from None
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def new_lab(root: Path, number: str, module: str, title: str | None = None) -> list[Path]:
    """Scaffold lab ``number`` (two digits, ``"07"``) with module ``module`` (a lower-case
    identifier) in the course at ``root``; ``title`` defaults to the module's name in words.

    Writes the six files of ``lab_files`` and appends the lab to ``labs.yaml``; returns
    their paths (``labs.yaml`` last), all under ``root``. Overwrites nothing: all files or
    none. Raises ScaffoldError (bad ``number``, ``module`` or ``title``, lab exists
    already, cannot write) and ManifestError (``root`` holds no valid ``labs.yaml``)."""
    title = _check_args(number, module, title)
    root = Path(root).resolve()
    course = manifest.load(root)
    _check_new(root, course, number)
    files, entry = render(number, module, title)
    old, new = _new_manifest(root, number, entry)
    _write(root, number, files, old, new)
    return [root / rel for rel in files] + [root / manifest.MANIFEST]
