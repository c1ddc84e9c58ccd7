"""pytest plugin: the implementation fixture, the run seed, markers, results.

Registered as a ``pytest11`` entry point, so ``pytest labs/04`` and the hidden
graders get it without a conftest. It is inert outside a course tree (no
``labs.yaml`` above the rootdir).

Fixtures
  ``lab``       the test's lab (``harness.manifest.Lab``), from its ``NN`` folder.
  ``impl``      the implementation module chosen by ``--impl`` (student,
                solution or PATH), loaded by path and checked against the contract.
  ``seed``      an int derived from the run seed and the test's node id.
  ``gen``       a CPU ``torch.Generator`` seeded with ``seed``.
  ``record_perf`` ``record_perf(name, ratio, **figures)``: report a performance
                figure. In a test marked ``perf`` (or ``perf(name)``) ``name`` must be
                a perf key of the lab in ``labs.yaml`` (the one the marker names),
                recorded once: its threshold scales the test's credit. In any other
                test it must not be a perf key: an informational figure, never graded.
Markers: ``gpu``, ``perf`` / ``perf(key)``, ``part(name)``, ``points(weight)``.

Joins with ``labs.yaml`` are checked where they are made (a grader defect is never a
student's score): a ``part`` marker naming no part of its lab, a grader test (under
``graders/``) without one, or a ``perf(key)`` naming no perf key is a collection
error; a ``record_perf`` name breaking the rule above, or a perf test that passes
without recording its key, fails the test and records ``labs_infra`` (``labs grade``
then fails with "grading failed" instead of scoring).

``--sandbox none`` (default) imports the implementation here, for readable local
runs; ``--sandbox worker`` (``labs grade``) makes ``impl`` a proxy to a separate,
unprivileged worker process (``harness.sandbox.worker``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sys
import tempfile
from pathlib import Path

import pytest

from . import impl as _impl
from . import manifest as _manifest
from .errors import InfraFailure

_state_key = pytest.StashKey["_LabsState"]()

GPU_SKIP_REASON = "needs a CUDA GPU (torch.cuda.is_available() is False here); graded on a GPU runner"
MIN_TRITON = (3, 0)  # the oldest Triton whose CUDA backend the labs' kernels and graders use (tl.dot, masks)


def _tagged(error: Exception, kind: str | None) -> Exception:
    """``error`` carrying ``labs_kind``: what kind of implementation failure it is
    (``missing``, ``import``, ``api``), recorded as the test's ``impl_error`` field."""
    error.labs_kind = kind
    return error


class _LabsState:
    def __init__(self, config, course):
        self.course = course
        self.impl_spec = config.getoption("impl") or config.getini("labs_impl") or "student"
        self.invocation_dir = Path(config.invocation_params.dir)
        seed = config.getoption("labs_seed")
        if seed is None and os.environ.get("LABS_SEED", "").isdigit():
            seed = os.environ["LABS_SEED"]  # `labs grade` passes it here: a command line is world-readable
        os.environ.pop("LABS_SEED", None)
        if seed is None and hasattr(config, "workerinput"):
            seed = config.workerinput.get("labs_seed")  # the controller's seed (xdist)
        self.seed = int(seed) if seed is not None else secrets.randbits(32)
        self.sandbox_mode = config.getoption("labs_sandbox") or "none"
        self.results_path = config.getoption("labs_results")
        self._modules = {}
        self._sandboxes = {}

    def lab_of(self, path: Path):
        for part in reversed(Path(path).parts):
            if part in self.course.labs:
                return self.course.labs[part]
        return None

    def module_file(self, lab) -> Path:
        root = _impl.impl_root(self.impl_spec, self.course, self.invocation_dir)
        return _impl.locate(root, lab)

    def module(self, lab):
        """Load once per lab; remember a failure so each test reports it. (The contract's names
        and calls are checked where a test uses them: a missing name fails that test.)"""
        if lab.number not in self._modules:
            kind = "missing"
            try:
                path = self.module_file(lab)
                kind = "import"
                mod = _impl.load_module(path)
                missing = _impl.missing_names(mod, lab)
                if missing and not hasattr(mod, "__getattr__"):  # PEP 562: only names the module lacks
                    def absent(name, _missing=missing):
                        if name in _missing:
                            raise _impl.APIMismatch(_missing[name])
                        raise AttributeError(name)
                    mod.__getattr__ = absent
                self._modules[lab.number] = mod
            except _impl.ImplError as e:
                self._modules[lab.number] = _tagged(e, kind)
        got = self._modules[lab.number]
        if isinstance(got, Exception):
            raise got
        return got

    def remote_module(self, lab):
        """``--sandbox worker``: a proxy to the module imported in a worker process
        (harness.sandbox.worker); the submission never runs in this process.

        A sandbox that cannot start raises InfraFailure, for this test and (at once)
        for every later one of the lab; the submission's own failures raise ImplError."""
        from .sandbox import worker as _sandbox
        if lab.number not in self._sandboxes:
            try:
                path = self.module_file(lab)
            except _impl.ImplError as e:
                self._sandboxes[lab.number] = _tagged(e, "missing")
            else:
                self._sandboxes[lab.number] = _sandbox.Sandbox(self._worker_config(lab, path), path)
        sb = self._sandboxes[lab.number]
        if isinstance(sb, Exception):
            raise sb
        try:
            sb.ensure()
        except _sandbox.SandboxStartError as e:
            self._sandboxes[lab.number] = InfraFailure(str(e))
            sb.close()
            raise self._sandboxes[lab.number] from None
        except _sandbox.SandboxError as e:
            kind = "timeout" if sb.import_timed_out else "import" if sb.import_error else None
            raise _tagged(_impl.ImplError(str(e)), kind) from None
        sb.begin_test()
        return _sandbox.RemoteModule(sb, sb.module_path, "labimpl_" + lab.module)

    def _worker_config(self, lab, path: Path):
        from .sandbox import worker as _sandbox
        root = self.course.root
        stub = root / "labs" / lab.number / lab.filename
        harness_dir = Path(__file__).resolve().parent
        hide = [root / "graders", root / "solutions", root / "tests"]
        for extra in (Path(self.results_path).resolve().parent if self.results_path else None, path.parent.parent):
            if extra is not None and extra != Path("/") and extra not in harness_dir.parents and extra != root:
                hide.append(extra)
        # LABS_SANDBOX_CALL_TIMEOUT (seconds): one limit for a call's waiting and its computing both,
        # below the lab's (the framework's own tests of hanging and CPU-burning submissions)
        env_timeout = os.environ.get("LABS_SANDBOX_CALL_TIMEOUT", "")
        override = float(env_timeout) if env_timeout.replace(".", "", 1).isdigit() else None
        timeout = override or min(lab.limits.call_timeout_s, max(5.0, lab.limits.test_timeout_s - 5))
        return _sandbox.WorkerConfig(
            module_source=path.read_text(errors="replace"), module_filename=lab.filename,
            stub_source=stub.read_text() if stub.is_file() and stub.resolve() != path.resolve() else None,
            api=list(lab.api), lab=lab.number, hide=[str(p) for p in hide if p.is_dir()], own=str(path.parent.parent),
            memory_mb=lab.limits.memory_mb,
            cpu_s=int(lab.limits.timeout_s * max(1.0, lab.limits.cpus)), nproc=lab.limits.pids,
            call_timeout_s=timeout, call_cpu_s=min(lab.limits.call_cpu_s, override or lab.limits.call_cpu_s))

    def close(self):
        from .sandbox import ranks
        ranks.shutdown()  # the ranks of multi-rank labs
        for sb in self._sandboxes.values():
            if not isinstance(sb, Exception):
                sb.close()
        self._sandboxes.clear()


def _record(node, key: str, value) -> None:
    """A structured result field (``labs_infra``, ``labs_impl_error``) for ResultsWriter:
    a record carried by the test report, never a message matched later."""
    node.user_properties.append((key, value))


def pytest_addoption(parser):
    group = parser.getgroup("labs", "AI-infrastructure labs")
    group.addoption("--impl", default=None, metavar="student|solution|PATH",
                    help="implementation to test: the student stub in labs/NN (default), the "
                         "reference in solutions/NN, or a directory holding NN/<module>.py")
    parser.addini("labs_impl", "default for --impl", default="student")
    group.addoption("--seed", dest="labs_seed", default=None, type=int,
                    help="run seed for generated inputs (default: random, printed in the header)")
    group.addoption("--labs-results", default=None, metavar="FILE",
                    help="write per-test results as JSON to FILE (used by `labs grade`)")
    group.addoption("--sandbox", dest="labs_sandbox", default=None, choices=("none", "worker"),
                    help="none (default): import the implementation into this process; worker: run it in a "
                         "separate unprivileged process and send it copies of the inputs (`labs grade` uses it)")


def pytest_configure(config):
    for line in ("gpu: needs a CUDA GPU; skipped with the reason where there is none",
                 "perf(key): performance test recording the labs.yaml perf key `key`; credit scaled by its "
                 "thresholds",
                 "part(name): the lab part this test grades (labs.yaml parts)",
                 "points(weight): relative weight of this test within its part (default 1)"):
        config.addinivalue_line("markers", line)
    root = _course_root(config)
    if root is None:
        return  # not a course tree: stay inert
    try:
        course = _manifest.load(root)
    except _manifest.ManifestError as e:  # one line and a hint, not an INTERNALERROR traceback
        raise pytest.UsageError(f"labs: {e}" + (f"\n  hint: {e.hint}" if e.hint else "")) from None
    config.stash[_state_key] = _LabsState(config, course)
    _triton_interpreter_without_cuda(course)
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_XdistSeed(config.stash[_state_key].seed), "labs-xdist-seed")
    out = config.getoption("labs_results")
    if out and not hasattr(config, "workerinput"):
        config.pluginmanager.register(ResultsWriter(Path(out)), "labs-results")
    _register_progress(config, course)


def _register_progress(config, course):
    """Record visible-test runs in the local progress store (harness/progress.py):
    the recorder on the controller only; xdist workers just tag reports with parts."""
    from . import progress
    st = config.stash[_state_key]
    if not progress.should_record(config, st.impl_spec):
        return
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(progress.PartAnnotator(), "labs-progress-parts")
        return
    recorder = progress.ProgressRecorder(config, course, st.impl_spec, st.seed)
    config.stash[progress.recorder_key] = recorder
    config.pluginmanager.register(recorder, "labs-progress")


def pytest_unconfigure(config):
    if _state_key not in config.stash:
        return
    config.stash[_state_key].close()  # stop sandbox workers
    from . import progress
    recorder = config.stash.get(progress.recorder_key, None)
    if recorder is not None:
        del config.stash[progress.recorder_key]
        config.pluginmanager.unregister(recorder)


class _XdistSeed:
    """Hand the controller's run seed to every xdist worker (pytest-randomly's way),
    so one printed seed replays the whole run."""

    def __init__(self, seed: int):
        self.seed = seed

    def pytest_configure_node(self, node):
        node.workerinput["labs_seed"] = self.seed


def _course_root(config):
    """labs.yaml at or above the rootdir, else the invocation dir (pytest may pick a
    rootdir above the course when an option value such as ``--impl ../x`` is a path)."""
    for start in (config.rootpath, config.invocation_params.dir):
        try:
            return _manifest.find_root(start)
        except _manifest.ManifestError:
            continue
    return None


def _triton_interpreter_without_cuda(course):
    """Triton kernels run on CPU only under its interpreter, which Triton reads when a
    kernel is decorated: set ``TRITON_INTERPRET=1`` before any lab module is imported
    when a lab needs Triton and there is no CUDA device (an explicit setting wins). Under
    the interpreter ``@triton.autotune`` runs its first config untimed, as in grading
    (``harness.sandbox.triton_launches``)."""
    if not any("triton" in lab.requires for lab in course.labs.values()):
        return
    if "TRITON_INTERPRET" not in os.environ:
        import torch
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    if os.environ.get("TRITON_INTERPRET") == "1":
        from .sandbox import triton_launches
        triton_launches.install()


def _state(config) -> _LabsState:
    st = config.stash.get(_state_key, None)
    if st is None:
        raise pytest.UsageError("the labs plugin found no labs.yaml above the rootdir")
    return st


def pytest_report_header(config):
    st = config.stash.get(_state_key, None)
    if st is None:
        return None
    try:
        import torch
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (no CUDA)"
    except Exception:  # pragma: no cover - torch missing is reported by the tests themselves
        device = "unknown"
    return [f"labs: course {st.course.root}, impl {st.impl_spec}, device {device}",
            f"labs: seed {st.seed} (replay with --seed {st.seed})"]


GRADER_DEFECT = "grader defect, grading failed (not the submission's fault)"


def _names(keys) -> str:
    return ", ".join(keys) or "none"


def _marker_problem(st: _LabsState, item) -> str | None:
    """Why ``item``'s ``part`` / ``perf`` markers do not join ``labs.yaml``, or None.

    A test inside a lab folder: a ``part`` marker names one of the lab's parts, a
    ``perf(key)`` marker one of its perf keys. A grader test (under ``graders/``) must
    carry a part: ``harness.grading.score`` shares a part's points among its tests.
    Visible tests (``labs/NN``) should (``labs progress`` reports by part, ``-k
    part_a`` selects by it; the course's own labs all do) but need not."""
    course = st.course
    try:
        rel = Path(item.path).resolve().relative_to(course.root.resolve())
    except ValueError:
        rel = None
    grader = rel is not None and rel.parts[:1] == ("graders",)
    lab = st.lab_of(item.path)
    if lab is None:
        if grader and len(rel.parts) > 2:
            return (f"{item.nodeid}: graders/{rel.parts[1]} is not a lab in labs.yaml "
                    f"(labs: {_names(sorted(course.labs))})")
        return None
    where = f"lab {lab.number} in labs.yaml"
    part = item.get_closest_marker("part")
    if part is None:
        if grader:
            return (f"{item.nodeid}: no part marker: every grader test of lab {lab.number} needs "
                    f"@pytest.mark.part(NAME), NAME one of the parts of {where}: {_names(lab.parts)}")
    elif len(part.args) != 1 or part.kwargs or not isinstance(part.args[0], str):
        return f"{item.nodeid}: the part marker takes one part name, e.g. @pytest.mark.part('A'); got {part}"
    elif part.args[0] not in lab.parts:
        return (f"{item.nodeid}: part {part.args[0]!r} is not a part of {where} "
                f"(its parts: {_names(lab.parts)})")
    perf = item.get_closest_marker("perf")
    if perf is not None and (perf.args or perf.kwargs):
        if len(perf.args) != 1 or perf.kwargs or not isinstance(perf.args[0], str):
            return (f"{item.nodeid}: the perf marker takes one perf key, e.g. @pytest.mark.perf('gqa_vs_sdpa'); "
                    f"got {perf}")
        if perf.args[0] not in lab.perf:
            return (f"{item.nodeid}: perf marker names {perf.args[0]!r}, not a perf key of {where} "
                    f"(its perf keys: {_names(lab.perf)})")
    return None


def pytest_itemcollected(item):
    """One part-selection scheme for visible tests and graders: a test marked
    ``@pytest.mark.part("A")`` also matches ``-k part_a``."""
    marker = item.get_closest_marker("part")
    if marker is not None and len(marker.args) == 1 and isinstance(marker.args[0], str):
        item.extra_keyword_matches.add(f"part_{marker.args[0].lower()}")


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """A test whose markers do not join ``labs.yaml`` is a collection error of its
    module (as a marker unknown to ``--strict-markers`` is), naming the test, the
    marker and what ``labs.yaml`` declares."""
    made = yield
    st = collector.config.stash.get(_state_key, None)
    if st is None or made is None:
        return made
    for item in made if isinstance(made, list) else [made]:
        if isinstance(item, pytest.Function):
            problem = _marker_problem(st, item)
            if problem:
                raise collector.CollectError(f"labs: {problem}")
    return made


def _perf_key(item) -> str | None:
    """The perf key a ``perf(key)`` marker declares (None: no marker, or a bare ``perf``)."""
    perf = item.get_closest_marker("perf")
    return perf.args[0] if perf is not None and perf.args else None


def _perf_record_problem(item, lab, name: str) -> str | None:
    """Why ``record_perf(name, ...)`` in ``item`` does not join ``labs.yaml``, or None."""
    call = f"record_perf({name!r})"  # the test's nodeid is named by its report
    marked = item.get_closest_marker("perf") is not None
    declared = _perf_key(item)
    keys = f"(perf keys of lab {lab.number} in labs.yaml: {_names(lab.perf)})"
    if marked:
        if name not in lab.perf:
            return f"{call}: {name!r} is not a perf key of lab {lab.number} in labs.yaml {keys}"
        if declared is not None and name != declared:
            return f"{call}: the test's marker is @pytest.mark.perf({declared!r}), which it must record {keys}"
        if any(k == "labs_perf" and e["name"] == name for k, e in item.user_properties):
            return f"{call}: recorded twice; a perf key is recorded once per test"
    elif name in lab.perf:
        return (f"{call}: {name!r} is a graded perf key of lab {lab.number} but the test has no perf marker: "
                f"mark it @pytest.mark.perf({name!r}) (or record an informational figure under another name)")
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None:
        import torch
        if not torch.cuda.is_available():
            pytest.skip(GPU_SKIP_REASON)
        lab = _state(item.config).lab_of(item.path)
        if lab is not None and "triton" in lab.requires:
            why = _triton_missing()
            if why and item.config.getoption("labs_sandbox") == "worker":  # a graded run: the runner is broken
                _record(item, "labs_infra", f"the grading environment's Triton: {why}")
                pytest.fail(f"grading environment: {why}", pytrace=False)
            if why:  # a local run or the GPU check in another Python: say so and go on
                pytest.skip(why)


def _triton_missing() -> str:
    """Why this environment's Triton cannot run a lab's GPU tests, or '' (a GPU machine
    graded outside the course image may carry another Triton, or none)."""
    try:
        import triton
    except ImportError as e:
        return f"needs Triton >= {'.'.join(map(str, MIN_TRITON))} with its CUDA backend; not importable here ({e})"
    have = tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])
    if have < MIN_TRITON:
        return (f"needs Triton >= {'.'.join(map(str, MIN_TRITON))}; this environment has {triton.__version__} "
                f"(the course image pins the lock's)")
    return ""


def _lab_for(request):
    st = _state(request.config)
    lab = st.lab_of(request.node.path)
    if lab is None:
        raise pytest.UsageError(f"{request.node.nodeid}: not inside a lab folder NN named in labs.yaml")
    return st, lab


@pytest.fixture(scope="session")
def labs_course(request):
    """The course manifest (``harness.manifest.Course``)."""
    return _state(request.config).course


@pytest.fixture
def lab(request):
    """The lab this test belongs to (``harness.manifest.Lab``)."""
    return _lab_for(request)[1]


@pytest.fixture
def impl(request):
    """The implementation module under test (see ``--impl``).

    A failure is recorded as well as reported: ``labs_infra`` (not the submission's
    fault: grading fails) or ``labs_impl_error`` (missing, import, api)."""
    st, lab = _lab_for(request)
    try:
        if st.sandbox_mode == "worker":
            return st.remote_module(lab)
        return st.module(lab)
    except InfraFailure as e:  # the impl fixture records it as the test's ``infra`` field
        _record(request.node, "labs_infra", e.reason)
        pytest.fail(f"grading failed, not the submission's fault: {e.reason}", pytrace=False)
    except _impl.ImplError as e:
        if getattr(e, "labs_kind", None):
            _record(request.node, "labs_impl_error", e.labs_kind)
        pytest.fail(str(e), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A sandbox that could not (re)start in the middle of a test (``SandboxStartError``,
    raised by the trusted client only: a worker can send back builtin exceptions only)
    is recorded as an infrastructure failure of that test."""
    report = (yield).get_result()
    worker = sys.modules.get(f"{__package__}.sandbox.worker")  # not imported: no sandbox ran
    if worker is not None and call.excinfo is not None and isinstance(call.excinfo.value, worker.SandboxStartError):
        report.user_properties.append(("labs_infra", str(call.excinfo.value)[:4000]))
    if call.excinfo is not None and isinstance(call.excinfo.value, _impl.APIMismatch):
        report.user_properties.append(("labs_impl_error", "api"))  # the class status: every test failed this way
    exc = call.excinfo.value if call.excinfo is not None else None
    if worker is not None and isinstance(exc, worker.NotRun):
        report.user_properties.append(("labs_not_run", str(exc)[:1000]))
    ranks = sys.modules.get(f"{__package__}.sandbox.ranks")
    if (worker is not None and isinstance(exc, worker.WorkerTimeout)) or getattr(exc, "timed_out", False) \
            or (ranks is not None and isinstance(exc, ranks.RankTimeout)):
        report.user_properties.append(("labs_impl_error", "timeout"))  # the class status: timeout
    if call.when == "call" and report.passed and item.get_closest_marker("perf") is not None:
        _unrecorded_perf(item, report)


def _unrecorded_perf(item, report) -> None:
    """A perf test that passed without recording its perf key would earn full credit
    unmeasured: fail it as a grader defect (``labs_infra``)."""
    st = item.config.stash.get(_state_key, None)
    lab = st.lab_of(item.path) if st is not None else None
    if lab is None:
        return
    declared = _perf_key(item)
    recorded = [e["name"] for k, e in item.user_properties if k == "labs_perf"]
    if any(n == declared if declared else n in lab.perf for n in recorded):
        return
    want = repr(declared) if declared else f"one of its perf keys ({_names(lab.perf)})"
    problem = (f"a perf test of lab {lab.number} passed without calling record_perf({want}): "
               "its credit would not be measured")
    report.outcome = "failed"
    report.longrepr = f"{GRADER_DEFECT}: {problem}"
    report.user_properties.append(("labs_infra", problem))


@pytest.fixture
def seed(request):
    """Per-test seed: sha256 of the run seed and the node id (pytest-randomly style)."""
    st = _state(request.config)
    digest = hashlib.sha256(f"{st.seed}:{request.node.nodeid}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@pytest.fixture
def gen(seed):
    """A CPU ``torch.Generator`` seeded for this test."""
    import torch
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def record_perf(request):
    """``record_perf(name, ratio, **figures)`` -- see the module docstring. A name that
    does not join ``labs.yaml`` fails the test as a grader defect: recorded as
    ``labs_infra``, so grading fails instead of giving full or no credit."""
    def record(name: str, ratio: float | None, **figures):
        _, lab = _lab_for(request)
        problem = _perf_record_problem(request.node, lab, name)
        if problem:
            _record(request.node, "labs_infra", problem)
            pytest.fail(f"{GRADER_DEFECT}: {problem}", pytrace=False)
        entry = {"name": name, "ratio": None if ratio is None else float(ratio),
                 "figures": {k: (float(v) if isinstance(v, (int, float)) else str(v)) for k, v in figures.items()}}
        request.node.user_properties.append(("labs_perf", entry))
    return record


def pytest_terminal_summary(terminalreporter, config):
    st = config.stash.get(_state_key, None)
    if st is None:
        return
    lines = []
    for rep in terminalreporter.getreports("passed") + terminalreporter.getreports("failed"):
        for key, entry in getattr(rep, "user_properties", []):
            if key == "labs_perf":
                figs = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry["figures"].items())
                ratio = "n/a" if entry["ratio"] is None else f"{entry['ratio']:.3f}"
                lines.append(f"{entry['name']}: ratio {ratio}  {figs}")
    if lines:
        terminalreporter.write_sep("-", "labs performance figures")
        for line in lines:
            terminalreporter.write_line(line)


def _meta(item) -> dict:
    part = item.get_closest_marker("part")
    points = item.get_closest_marker("points")
    return {"part": part.args[0] if part else None,
            "weight": float(points.args[0]) if points else 1.0,
            "gpu": item.get_closest_marker("gpu") is not None,
            "perf_test": item.get_closest_marker("perf") is not None,  # the marker; "perf": the figures
            "perf_key": _perf_key(item)}


def _message(report) -> str:
    """The failure's own message (the grader's bug-class text), else the long repr, capped."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    text = text.removeprefix("Failed: ").removeprefix(f"{_impl.APIMismatch.__module__}.APIMismatch: ")
    if isinstance(report.longrepr, tuple):  # skip: (file, line, reason)
        text = report.longrepr[2]
    return text[:4000]


class ResultsWriter:
    """Writes every collected test and its outcome to a JSON file, rewritten
    atomically after each test, so a crash or kill mid-run loses nothing
    already graded (tests never reached stay ``pending``).

    Per test: ``nodeid``, ``name``, ``part``, ``weight``, ``gpu``, ``perf_test`` (the
    ``perf`` marker), ``perf_key`` (the key ``perf(key)`` declares, or null), ``perf``
    (the figures recorded, ``[{name, ratio, figures}]``), ``outcome``, ``message``,
    ``duration``, and two records:
    ``infra`` (null, or why the test could not run through no fault of the
    submission: ``harness.grading`` then fails instead of scoring) and
    ``impl_error`` (null, ``missing``, ``import`` or ``api``: the implementation
    could not be loaded, the class status in ``harness.classroom``)."""

    def __init__(self, path: Path):
        self.path = path
        self.tests: dict[str, dict] = {}
        self.errors: list[str] = []

    def _flush(self, finished=False):
        data = {"finished": finished, "errors": self.errors, "tests": list(self.tests.values())}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".results-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(f"collecting {report.nodeid}: {str(report.longrepr)[-2000:]}")

    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.tests[item.nodeid] = {"nodeid": item.nodeid, "name": item.name, **_meta(item),
                                       "outcome": "pending", "message": "", "duration": 0.0, "perf": [],
                                       "infra": None, "impl_error": None}
        self._flush()

    def pytest_deselected(self, items):  # ``-k`` (a selection): not part of this run
        for item in items:
            self.tests.pop(item.nodeid, None)
        self._flush()

    def pytest_runtest_logreport(self, report):
        t = self.tests.get(report.nodeid)
        if t is None:
            return
        t["duration"] += report.duration
        if report.when == "call" or report.outcome != "passed":
            if t["outcome"] in ("pending", "passed"):
                t["outcome"] = "error" if (report.failed and report.when != "call") else report.outcome
                t["message"] = _message(report) if report.outcome != "passed" else ""
        t["perf"] = [e for k, e in report.user_properties if k == "labs_perf"]
        for key, value in report.user_properties:
            field = {"labs_infra": "infra", "labs_impl_error": "impl_error"}.get(key)
            if field and t[field] is None:
                t[field] = value
            if key == "labs_not_run":  # the budget was spent before this test: it did not run
                t["outcome"], t["message"] = "not run", value
        if report.when == "teardown":
            self._flush()

    def pytest_sessionfinish(self, session):
        self._flush(finished=True)
