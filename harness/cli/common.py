"""What every ``labs`` command module shares: the course a command works on, the console.

A leaf of ``harness.cli``: the group (``cli/__init__.py``) imports the command modules,
and they import this, never the group, so the package has no import cycle.
"""
from __future__ import annotations

from rich.console import Console

from .. import manifest


def console() -> Console:
    """stdout as rich writes it: no highlighting, long lines kept whole."""
    return Console(highlight=False, soft_wrap=True)


def course_of(ctx) -> manifest.Course:
    """The course of this command: ``--course DIR``, else found upwards from the current
    directory. Raises ManifestError with a hint saying how to name it."""
    try:
        return manifest.load(ctx.obj.get("course"))
    except manifest.ManifestError as e:
        e.hint = e.hint or "run inside the course repository or pass --course DIR"
        raise
