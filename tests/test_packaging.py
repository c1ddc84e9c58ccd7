"""`make setup` is quiet (issue 33.7): pyproject.toml declares every folder the install
carries, so setuptools' package discovery warns about none, and the wheel holds every
template the commands read."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_builds_without_package_warnings_and_carries_the_templates(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "harness", src / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-v",
                           "-w", str(tmp_path / "dist")], cwd=src, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "would be ignored" not in out and "SetuptoolsDeprecationWarning" not in out, out[-5000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    on_disk = {p.relative_to(ROOT).as_posix() for folder in ("harness/templates", "harness/server/templates")
               for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert on_disk and on_disk <= names, sorted(on_disk - names)
    assert "harness/server/migrations/script.py.mako" in names
