"""The one error base of the framework, at the bottom of every layer.

Every error a user can meet (a bad argument, an invalid labs.yaml, a submission
that cannot be placed, a grading run that could not run) is a :class:`LabsError`:
a one-line message naming the argument and its value, an optional ``hint``
saying what to do, and the :class:`ExitCode` the ``labs`` command exits with.
Domain errors subclass it (``ManifestError``, ``GradingError``, ``SandboxError``,
...), so ``harness.cli`` shows every one of them the same way; the model is
pytest's ``UsageError`` and click's ``ClickException``. Test outcomes (a rank's
assertion) are not errors of the framework: they stay ``AssertionError``.
"""
from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit status of the ``labs`` command."""
    OK = 0              # the command ran (for grade: grading ran, whatever the score)
    GRADING_FAILED = 1  # grading itself could not run (graders broken, the sandbox or grader failed)
    USAGE = 2           # bad arguments: unknown lab, missing path, invalid labs.yaml


class LabsError(Exception):
    """A one-line error with an optional ``hint`` and an :class:`ExitCode`.

    Subclasses set ``code`` (default ``USAGE``); ``LabsError(message, code=...,
    hint=...)`` overrides both per instance."""

    code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str = "", code: ExitCode | None = None, hint: str = ""):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = ExitCode(code)
        self.hint = hint


class GradingError(LabsError):
    """Grading could not run or its results could not be read (graders broken, bad
    labs.yaml scoring, the sandbox or container failed)."""
    code = ExitCode.GRADING_FAILED


class InfraFailure(GradingError):
    """Grading failed for a reason that is not the submission's (the sandbox could
    not start, the grader run crashed, the results were lost): never charged to a
    student as a 0. ``reason`` is one line (at most 1,000 characters)."""

    def __init__(self, reason: str):
        self.reason = " ".join(str(reason).split())[:1000]
        super().__init__(f"grading failed: {self.reason}",
                         hint="not the submission's fault: fix the grading environment, then grade again")
