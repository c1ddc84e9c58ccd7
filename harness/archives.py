"""Unpacking a submission's archive safely: the intake of ``labs grade-all`` and the course server.

An archive (``.zip``, ``.tar.gz``/``.tgz``, ``.tar``, ``.tar.bz2``, ``.tar.xz``) is
unpacked into a fresh folder: no absolute paths, no ``..``, no links, devices or sparse
files, at most ``MAX_MEMBERS`` entries and ``max_bytes`` bytes in all (counted while
reading, so a lying header cannot blow the disk up). Metadata is capped before it is
read into memory: a tar's GNU long name/link and pax headers at ``TAR_HEADER_MAX``
bytes each and ``TAR_HEADERS_TOTAL`` in all, a zip's central directory at
``ZIP_DIRECTORY_MAX``. Errors name the archive's problem in a few hundred characters,
whatever its names.
"""
from __future__ import annotations

import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from .errors import LabsError

ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")
MAX_MEMBERS = 10_000
DEFAULT_MAX_UNPACKED_MB = 200
TAR_HEADER_MAX = 64 << 10       # bytes: one GNU long name/link or pax header
TAR_HEADERS_TOTAL = 2 << 20     # bytes: all of them in one archive
PAX_GLOBAL_KEYS_MAX = 64        # keys in pax global headers (copied into every member)
ZIP_DIRECTORY_MAX = 4 << 20     # bytes: a zip's central directory (read whole by zipfile)
ERROR_MAX = 200                 # characters of a name or an error quoted in a message


class UnpackError(LabsError):
    """An archive is corrupt, unsafe or too large; the message says which and why."""


def _short(text: str, limit: int = ERROR_MAX) -> str:
    """``text`` cut to ``limit`` characters (a name or an error quoted in a status)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def archive_stem(name: str) -> str | None:
    """``alice.tar.gz`` -> ``alice``; ``None`` for a name that is no archive."""
    low = name.lower()
    for ext in ARCHIVES:
        if low.endswith(ext) and len(name) > len(ext):
            return name[: -len(ext)]
    return None


def _safe_member(name: str) -> PurePosixPath:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or name.startswith(("/", "\\")) or (p.parts and ":" in p.parts[0]):
        raise UnpackError(f"absolute path {_short(repr(name))} in the archive")
    if ".." in p.parts:
        raise UnpackError(f"path traversal {_short(repr(name))} in the archive")
    return p


def _copy_capped(src, dest: Path, budget: list[int], limit: int) -> None:
    with open(dest, "wb") as out:
        while chunk := src.read(1 << 16):
            budget[0] += len(chunk)
            if budget[0] > limit:
                raise UnpackError(f"unpacks to more than {limit // 2**20} MiB")
            out.write(chunk)


_TAR_EXTENDED = {tarfile.GNUTYPE_LONGNAME: "GNU long name", tarfile.GNUTYPE_LONGLINK: "GNU long link",
                 tarfile.XHDTYPE: "pax", tarfile.XGLTYPE: "pax global", tarfile.SOLARIS_XHDTYPE: "pax"}


class _GuardedTarInfo(tarfile.TarInfo):
    """tarfile reads a GNU long name/link or pax header whole (``_proc_gnulong``,
    ``_proc_pax``) and copies pax global headers into every member; this checks the
    size a header declares before it is read and the global keys before the next
    header, so a small archive cannot fill the memory. Sparse files are refused."""

    @classmethod
    def fromtarfile(cls, tf):
        if len(tf.pax_headers) > PAX_GLOBAL_KEYS_MAX:
            raise UnpackError(f"pax global headers with more than {PAX_GLOBAL_KEYS_MAX} keys")
        return super().fromtarfile(tf)

    def _proc_member(self, tf):
        if self.type in _TAR_EXTENDED:
            tf.labs_header_bytes = getattr(tf, "labs_header_bytes", 0) + self.size
            if self.size > TAR_HEADER_MAX:
                raise UnpackError(f"a {_TAR_EXTENDED[self.type]} header of {self.size} bytes "
                                  f"(at most {TAR_HEADER_MAX >> 10} KiB)")
            if tf.labs_header_bytes > TAR_HEADERS_TOTAL:
                raise UnpackError(f"long-name and pax headers of more than {TAR_HEADERS_TOTAL >> 20} MiB in all")
        return super()._proc_member(tf)

    def _refuse_sparse(self, *args):
        raise UnpackError("sparse file in the archive")

    _proc_sparse = _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse


def _unpack_tar(archive: Path, dest: Path, budget: list[int], max_bytes: int) -> None:
    with tarfile.open(archive, "r:*", tarinfo=_GuardedTarInfo) as tf:
        count = 0
        for m in tf:
            count += 1
            if count > MAX_MEMBERS:
                raise UnpackError(f"more than {MAX_MEMBERS} entries")
            rel = _safe_member(m.name)
            if not (m.isfile() or m.isdir()):
                raise UnpackError(f"{'link' if m.issym() or m.islnk() else 'special file'} "
                                  f"{_short(repr(m.name))} in the archive")
            target = dest.joinpath(*rel.parts) if rel.parts else dest
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_capped(tf.extractfile(m), target, budget, max_bytes)


def _unpack_zip(archive: Path, dest: Path, budget: list[int], max_bytes: int) -> None:
    with open(archive, "rb") as f:  # zipfile reads the whole central directory first
        end = zipfile._EndRecData(f)
    if end and end[zipfile._ECD_SIZE] > ZIP_DIRECTORY_MAX:
        raise UnpackError(f"a zip directory of {end[zipfile._ECD_SIZE]} bytes (at most {ZIP_DIRECTORY_MAX >> 20} MiB)")
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise UnpackError(f"{len(infos)} entries (at most {MAX_MEMBERS})")
        for info in infos:
            rel = _safe_member(info.filename)
            if stat.S_ISLNK(info.external_attr >> 16):
                raise UnpackError(f"link {_short(repr(info.filename))} in the archive")
            target = dest.joinpath(*rel.parts) if rel.parts else dest
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src:
                _copy_capped(src, target, budget, max_bytes)


def unpack(archive: Path, dest: Path, max_bytes: int = DEFAULT_MAX_UNPACKED_MB << 20) -> Path:
    """Unpack ``archive`` (zip or tar, any compression) into ``dest`` (created) and
    return ``dest``: regular files and folders only, at most ``max_bytes`` bytes in
    all and ``MAX_MEMBERS`` entries, metadata capped before it is read (see the
    module docstring). Raises UnpackError saying why (at most a few hundred
    characters, whatever the archive's names)."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        (_unpack_zip if archive.name.lower().endswith(".zip") else _unpack_tar)(archive, dest, [0], max_bytes)
    except UnpackError:
        raise
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError, RuntimeError) as e:
        raise UnpackError(f"not a readable archive ({type(e).__name__}: {_short(str(e))})") from None
    return dest
