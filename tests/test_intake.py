"""Intake of a class cannot break: a student named like an output file, two entries
for one student, tar header bombs, an oversized module, names that are markup.
Real files and the real `labs grade-all` CLI; no grader runs except where a row
must be graded, so each test takes a few seconds."""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from harness import archives, classroom, grading, manifest, records
from tests.conftest import TOY_SOLUTION
from tests.test_classroom import labs_cmd

MAX_RSS_MB = 300  # the CLI alone is ~50 MB; the bombs took it to ~2 GB before


def tar_header(name: bytes, size: int, typeflag: bytes) -> bytes:
    """One 512-byte GNU tar header block, written by hand (tarfile would refuse to
    write a lying one): name at 0, size in octal at 124, typeflag at 156."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:124] = b"0000644\0" b"0000000\0" b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % 0
    h[156:157] = typeflag
    h[257:265] = b"ustar  \0"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def header_bomb(path: Path, typeflag: bytes, size: int) -> Path:
    """A .tar.gz whose first header (``typeflag``: L, K, x, g) declares ``size`` bytes
    of data, then a plain ``toy.py``: a gzip stream of gzip members (one 1 MiB chunk
    compressed once, repeated), so a GiB of header takes ~1 MB and milliseconds."""
    one = gzip.compress(b"a" * (1 << 20), 9)
    with open(path, "wb") as f:
        f.write(gzip.compress(tar_header(b"././@LongLink", size, typeflag)))
        for _ in range(size >> 20):
            f.write(one)
        f.write(gzip.compress(b"a" * (size % (1 << 20)) + b"\0" * (-size % 512)
                              + tar_header(b"toy.py", 0, b"0") + b"\0" * 1024))
    return path


def grade_all_measured(course: Path, subs: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run `labs grade-all` in a fresh wrapper process; returns it and the CLI's peak RSS in MB
    (``ru_maxrss`` of the wrapper's children: the CLI and whatever it waited for)."""
    wrap = ("import json, resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
            "print(json.dumps([p.returncode, p.stdout, p.stderr, rss]))")
    cmd = labs_cmd("grade-all", str(subs), "--lab", "07", "--out", str(out), "--sandbox", "process", *args)
    w = subprocess.run([sys.executable, "-c", wrap, *cmd], cwd=course, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LABS_PROGRESS": "off", "COLUMNS": "200"})
    rc, stdout, stderr, rss_kb = json.loads(w.stdout)
    return subprocess.CompletedProcess(cmd, rc, stdout, stderr), rss_kb / 1024


def rows(out: Path) -> dict[str, dict]:
    return {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}


def results(out: Path, student: str) -> dict:
    return json.loads(classroom.results_path(out, student).read_text())


def checkout(root: Path, text: str) -> Path:
    (root / "labs/07").mkdir(parents=True)
    (root / "labs/07/toy.py").write_text(text)
    return root


# --- 1. names equal to the class's own files ------------------------------------------------

def test_students_named_like_output_files_do_not_break_the_class_or_its_resume(toy_course, tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    checkout(subs / "grades.csv", TOY_SOLUTION)  # graded for real
    for name in ("results.json", "summary.json", "students", "eve[bold]"):  # nothing to grade: fast
        (subs / name).mkdir(parents=True)
    with zipfile.ZipFile(subs / "mallory.zip", "w") as zf:  # a status that is markup: "[/]"
        zf.writestr("../[/]evil.py", "")
    p, _ = grade_all_measured(toy_course, subs, out)
    assert p.returncode == 0, p.stdout + p.stderr
    got = rows(out)
    assert set(got) == {"grades.csv", "results.json", "summary.json", "students", "eve[bold]", "mallory"}
    assert got["grades.csv"]["status"] == "ok" and float(got["grades.csv"]["score"]) == pytest.approx(6.5)
    assert got["mallory"]["status"] == "unpack error: mallory.zip: path traversal '../[/]evil.py' in the archive"
    assert all(r["status"].startswith("no module: no toy.py") for s, r in got.items()
               if s not in ("grades.csv", "mallory"))
    assert results(out, "grades.csv")["score"] == pytest.approx(6.5)
    assert results(out, "students")["extra_data"]["student"] == "students"
    assert "eve[bold]: 0/10" in p.stdout and "path traversal '../[/]evil.py'" in p.stdout  # text, not markup
    assert sorted(x.name for x in out.iterdir()) == ["grades.csv", "students"]

    p, _ = grade_all_measured(toy_course, subs, out)  # resumed: everything kept
    assert p.returncode == 0 and "0 graded now, 6 skipped" in p.stdout, p.stdout + p.stderr
    assert rows(out) == got


def test_a_row_that_cannot_be_written_is_retried_and_the_class_goes_on(toy_course, tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    for name in ("alice", "bob"):
        (subs / name).mkdir(parents=True)
    (out / "students").mkdir(parents=True)
    (out / "students/alice").write_text("in the way")  # alice's results folder cannot be made
    lab = manifest.load(toy_course).lab("07")
    run = classroom.grade_all(subs, lab, manifest.load(toy_course), out, sandbox="process")
    by = {r.student: r for r in run.rows}
    assert by["alice"].retry and "cannot write students/alice/results.json" in by["alice"].status
    assert by["bob"].status.startswith("no module")
    assert results(out, "bob")["extra_data"]["status_kind"] == "student_error"
    assert rows(out)["alice"]["status"].startswith("infra_error: cannot write") and rows(out)["alice"]["score"] == ""

    (out / "grades.csv").unlink()
    (out / "grades.csv").mkdir()  # what older versions left for a student named grades.csv
    with pytest.raises(classroom.OutputError, match=r"grades\.csv is in the way: it should be a file"):
        classroom.grade_all(subs, lab, manifest.load(toy_course), out, sandbox="process")


def test_results_kept_by_an_older_version_are_resumed_and_moved_under_students(toy_course, tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    (subs / "bob").mkdir(parents=True)
    course = manifest.load(toy_course)
    lab = course.lab("07")
    row = classroom.grade_row(classroom.Submission("bob", subs / "bob"), lab, course)
    (out / "bob").mkdir(parents=True)
    (out / "bob/results.json").write_text(json.dumps(row.results))  # the old layout: OUT/<student>/
    run = classroom.grade_all(subs, lab, course, out, sandbox="process")
    assert run.rows[0].skipped and results(out, "bob") == row.results


# --- 2. two entries for one student -------------------------------------------------------

def test_two_entries_for_one_student_are_one_ambiguous_row_graded_neither(toy_course, tmp_path):
    subs, out, src = tmp_path / "subs", tmp_path / "out", checkout(tmp_path / "src", TOY_SOLUTION)
    subs.mkdir()
    with zipfile.ZipFile(subs / "alice.zip", "w") as zf:
        zf.write(src / "labs/07/toy.py", "labs/07/toy.py")
    with tarfile.open(subs / "alice.tar", "w") as tf:  # sorts first: once graded alone, as 0
        tf.addfile(tarfile.TarInfo("README.md"))
    checkout(subs / "carol", TOY_SOLUTION)
    (subs / "carol.tgz").write_bytes(b"")
    (subs / "dave").mkdir()
    p, _ = grade_all_measured(toy_course, subs, out)
    assert p.returncode == 0, p.stdout + p.stderr
    got = rows(out)
    assert got["alice"]["status"] == "ambiguous submission: alice.tar, alice.zip" and got["alice"]["score"] == ""
    assert got["carol"]["status"] == "ambiguous submission: carol, carol.tgz" and got["carol"]["score"] == ""
    res = results(out, "alice")
    assert res["score"] is None and res["tests"] == [] and res["extra_data"]["status_kind"] == "student_error"
    assert res["extra_data"]["entries"] == ["alice.tar", "alice.zip"]
    assert "ambiguous submission (alice.tar, alice.zip): graded neither; keep one and rerun" in p.stderr
    assert "(2 ambiguous: keep one entry each and rerun)" in p.stdout and "ambiguous submission: alice.tar" in p.stdout

    # kept while both are there; once staff remove one, the other is a new submission
    lab = manifest.load(toy_course).lab("07")
    (subs / "alice.tar").unlink()
    (alice,) = [s for s in classroom.discover(subs)[0] if s.student == "alice"]
    assert not alice.ambiguous and classroom.fingerprint(alice, lab) != res["extra_data"]["fingerprint"]


# --- 3. tar header bombs --------------------------------------------------------------------

@pytest.mark.parametrize("typeflag, size, what", [
    (b"L", 500 << 20, "GNU long name"),   # measured: 2.0 GB RSS and a 500 MB results.json before
    (b"x", 1800 << 20, "pax"),            # measured: 1.9 GB RSS before
])
def test_tar_header_bombs_are_refused_before_they_are_read(toy_course, tmp_path, typeflag, size, what):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    assert header_bomb(subs / "bomb.tar.gz", typeflag, size).stat().st_size < 2 << 20
    p, rss_mb = grade_all_measured(toy_course, subs, out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert rss_mb < MAX_RSS_MB, f"peak RSS {rss_mb:.0f} MB"
    assert rows(out)["bomb"]["status"] == (f"unpack error: bomb.tar.gz: a {what} header of {size} bytes "
                                           f"(at most {archives.TAR_HEADER_MAX >> 10} KiB)")
    assert classroom.results_path(out, "bomb").stat().st_size < 4096


@pytest.mark.parametrize("typeflag, what", [(b"K", "GNU long link"), (b"g", "pax global")])
def test_unpack_refuses_other_oversized_tar_headers(tmp_path, typeflag, what):
    with pytest.raises(archives.UnpackError, match=f"a {what} header of {64 << 20} bytes"):
        archives.unpack(header_bomb(tmp_path / "b.tar.gz", typeflag, 64 << 20), tmp_path / "out")


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n).encode() + body) != n:
        n += 1
    return str(n).encode() + body


def _tar_of(blocks: list[tuple[bytes, bytes, bytes]]) -> bytes:
    """(name, typeflag, data) headers with their data, then the end of the archive."""
    out = b"".join(tar_header(n, len(d), t) + d + b"\0" * (-len(d) % 512) for n, t, d in blocks)
    return gzip.compress(out + b"\0" * 1024)


@pytest.mark.parametrize("blocks, message", [
    # under the cap one by one, over it together (each member keeps its pax headers in memory)
    ([b for i in range(40) for b in ((b"x", b"x", _pax_record("comment", "c" * 60_000)), (b"f%d" % i, b"0", b""))],
     "more than 2 MiB in all"),
    # global keys are copied into every member that follows
    ([(b"g", b"g", b"".join(_pax_record(f"k{i}", "v") for i in range(100))), (b"toy.py", b"0", b"")],
     "pax global headers with more than 64 keys"),
    ([(b"toy.py", b"S", b"")], "sparse file in the archive"),
    ([(b"x", b"x", _pax_record("GNU.sparse.major", "1") + _pax_record("GNU.sparse.minor", "0")),
      (b"toy.py", b"0", b"")], "sparse file in the archive"),
])
def test_unpack_refuses_tar_metadata_that_would_fill_the_memory(tmp_path, blocks, message):
    (tmp_path / "s.tar.gz").write_bytes(_tar_of(blocks))
    with pytest.raises(archives.UnpackError, match=message):
        archives.unpack(tmp_path / "s.tar.gz", tmp_path / "out")


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_unpack_keeps_ordinary_long_names_and_a_git_archive_header(tmp_path, fmt):
    deep = "labs/07/" + "very_long_folder_name/" * 8 + "toy.py"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt,
                      pax_headers={"comment": "0123456789abcdef0123456789abcdef01234567"}) as tf:
        for name in (deep, "labs/07/toy.py", "naïve é.txt"):
            info = tarfile.TarInfo(name)
            info.size = len(TOY_SOLUTION)
            tf.addfile(info, io.BytesIO(TOY_SOLUTION.encode()))
    (tmp_path / "s.tar.gz").write_bytes(buf.getvalue())
    root = archives.unpack(tmp_path / "s.tar.gz", tmp_path / "out")
    assert (root / deep).read_text() == (root / "labs/07/toy.py").read_text() == TOY_SOLUTION
    assert (root / "naïve é.txt").is_file()


def test_unpack_errors_quote_at_most_a_few_hundred_characters(toy_course, tmp_path):
    name = "a" * 60_000  # under the header cap, but no file system takes it
    (tmp_path / "s.tar.gz").write_bytes(_tar_of([(b"././@LongLink", b"L", name.encode() + b"\0"),
                                                 (b"x", b"0", b"")]))
    with pytest.raises(archives.UnpackError) as e:
        archives.unpack(tmp_path / "s.tar.gz", tmp_path / "out")
    assert "not a readable archive (OSError" in str(e.value) and len(str(e.value)) < 300
    (tmp_path / "t.tar.gz").write_bytes(_tar_of([(b"././@LongLink", b"L", b"../" * 20_000 + b"\0"), (b"x", b"0", b"")]))
    course = manifest.load(toy_course)
    row = classroom.grade_row(classroom.Submission("t", tmp_path / "t.tar.gz"), course.lab("07"), course)
    assert row.status.startswith("unpack error: t.tar.gz: path traversal '../../")
    assert len(row.status) <= records.STATUS_MAX and len(json.dumps(row.results)) < 4096


def test_unpack_refuses_a_zip_whose_directory_is_too_large(tmp_path):
    with zipfile.ZipFile(tmp_path / "s.zip", "w") as zf:  # 80 names of 60,000 bytes: 4.8 MB of directory
        for i in range(80):
            zf.writestr(f"{i:02d}" + "n" * 60_000, b"")
    with pytest.raises(archives.UnpackError, match=r"a zip directory of \d+ bytes \(at most 4 MiB\)"):
        archives.unpack(tmp_path / "s.zip", tmp_path / "out")


# --- 4. an oversized module -------------------------------------------------------------------

def test_a_module_over_the_limit_is_a_row_saying_so(toy_course, tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    big = TOY_SOLUTION.encode() + b"#" * grading.MAX_MODULE_BYTES
    checkout(subs / "folder", "")
    (subs / "folder/labs/07/toy.py").write_bytes(big)
    info = tarfile.TarInfo("repo/labs/07/toy.py")
    info.size = 20 << 20  # 20 MiB unpacked, 20 KB on disk
    with tarfile.open(subs / "archive.tar.gz", "w:gz") as tf:
        tf.addfile(info, io.BytesIO(big + b"#" * (info.size - len(big))))
    p, _ = grade_all_measured(toy_course, subs, out)
    assert p.returncode == 0, p.stdout + p.stderr
    for student in ("folder", "archive"):
        assert rows(out)[student]["status"] == "no module: 07/toy.py is larger than 1 MiB: refused"
        res = results(out, student)
        assert res["score"] == 0 and res["tests"] == [] and res["extra_data"]["status_kind"] == "student_error"
