"""The one atomic writer: every result file, report, archive and secret the harness writes.

A reader sees the old file or the new one, never half of one (uv's output writer): the
data goes to a temporary file beside the target, which then replaces it in one rename
(``os.replace``), or with ``exclusive`` becomes it only where no file is there yet
(``os.link``: a concurrent writer's file wins, as two graders making the course secret
must agree). A write that fails leaves the target as it was and no temporary file.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import IO, Iterator

PRIVATE = 0o600  # grades, tokens, secrets: the owner only
SHARED = 0o666   # reports anyone may read: the umask decides, as for open()


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "w", *, perms: int = PRIVATE, exclusive: bool = False,
                **open_kw) -> Iterator[IO]:
    """Open a temporary file beside ``path`` (its folder created) for writing in ``mode``
    (``"w"`` or ``"wb"``); when the block ends without an error it becomes ``path`` (see
    the module docstring). ``perms``: the new file's mode bits before the umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.with_name(f".{path.name}-{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, perms)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, mode, **open_kw) as f:
            yield f
        if exclusive:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_atomic(path: Path | str, data: str | bytes, *, perms: int = PRIVATE, exclusive: bool = False) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through ``atomic_open``."""
    text = isinstance(data, str)
    with atomic_open(path, "w" if text else "wb", perms=perms, exclusive=exclusive,
                     **({"encoding": "utf-8", "newline": ""} if text else {})) as f:
        f.write(data)


def write_json(path: Path | str, data, *, perms: int = PRIVATE) -> None:
    """Write ``data`` as indented JSON to ``path`` through ``atomic_open``."""
    write_atomic(path, json.dumps(data, indent=2), perms=perms)
