"""What every ``labs`` command module shares: the course a command works on, the console.

A leaf of ``harness.cli``: the group (``cli/__init__.py``) imports the command modules,
and they import this, never the group, so the package has no import cycle.
"""
from __future__ import annotations

import os

from rich.console import Console

from .. import manifest


WIDTH_NOT_A_TERMINAL = 160  # a log or a pipe: rich's 80 would cut table cells mid-word


def console(stderr: bool = False) -> Console:
    """stdout (or stderr) as rich writes it: no highlighting, long lines kept whole, tables
    the terminal's width (or ``COLUMNS``), else 160 columns where the output is not a terminal."""
    c = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c.width = WIDTH_NOT_A_TERMINAL
    return c


def course_of(ctx) -> manifest.Course:
    """The course of this command: ``--course DIR``, else found upwards from the current
    directory. Raises ManifestError with a hint saying how to name it."""
    try:
        return manifest.load(ctx.obj.get("course"))
    except manifest.ManifestError as e:
        e.hint = e.hint or "run inside the course repository or pass --course DIR"
        raise
