"""labs.yaml loading and validation."""
import pytest

from harness import impl as _impl, manifest
from harness.manifest import PerfThreshold

from .conftest import ROOT


def test_course_manifest_loads_every_lab():
    course = manifest.load(ROOT)
    assert sorted(course.labs) == [f"{n:02d}" for n in range(1, 18)]
    for number, lab in course.labs.items():
        assert lab.number == number
        assert lab.points > 0
        assert (ROOT / "labs" / number).is_dir() or number not in ("04",)


def test_lab_lookup_accepts_int_and_names_known_labs():
    course = manifest.load(ROOT)
    assert course.lab(4) is course.lab("04") is course.lab("4")
    with pytest.raises(manifest.ManifestError, match="lists 01, 02"):
        course.lab(99)


@pytest.mark.parametrize("bad, message", [
    ("name: x\nlabs:\n  '4': {title: t, module: m, api: [], parts: {A: {title: a, points: 1}}}\n", "two-digit"),
    ("name: x\nlabs:\n  '04': {title: t, module: m, api: [], parts: {A: {title: a, points: 1}}, colour: red}\n",
     "labs.04.colour: Extra inputs are not permitted"),
    ("name: x\nlabs:\n  '04': {title: t, module: m-1, api: [], parts: {A: {title: a, points: 1}}}\n", "identifier"),
    ("name: x\nlabs:\n  '04': {title: t, module: m, api: [], parts: {A: {title: a, points: -1}}}\n",
     "labs.04.parts.A.points"),
    ("- just\n- a list\n", "expected a mapping"),
    ("name: [unclosed\n", "not valid YAML"),
])
def test_invalid_manifest_names_file_and_key(tmp_path, bad, message):
    (tmp_path / "labs.yaml").write_text(bad)
    with pytest.raises(manifest.ManifestError) as e:
        manifest.load(tmp_path)
    assert str(tmp_path / "labs.yaml") in str(e.value)
    assert message in str(e.value)


def test_perf_threshold_credit_comes_in_bands_and_is_clamped():
    t = PerfThreshold(baseline="b", full_credit=1.5, zero_credit=4.0)  # 4 bands: edges 2.125, 2.75, 3.375
    assert t.edges() == pytest.approx([1.5, 2.125, 2.75, 3.375, 4.0])
    assert t.credit(1.0) == 1.0 and t.credit(1.5) == 1.0
    assert t.credit(1.6) == t.credit(2.1) == pytest.approx(0.875)  # one credit across a band: noise inside it is free
    assert t.credit(2.75) == pytest.approx(0.625) and t.credit(2.76) == pytest.approx(0.375)
    assert t.credit(3.9) == pytest.approx(0.125)
    assert t.credit(4.0) == 0.0 and t.credit(10) == 0.0
    assert PerfThreshold(baseline="b", full_credit=1.0, zero_credit=2.0, bands=2).credit(1.25) == pytest.approx(0.75)
    assert t.credit(float("nan")) == 0.0
    with pytest.raises(ValueError, match="zero_credit"):
        PerfThreshold(baseline="b", full_credit=2, zero_credit=1)


def test_a_speedup_key_earns_nothing_from_its_baseline_and_calibrate_suggests_below_it():
    """A speed-up over the same work without the technique (speculative decoding against
    target-only decoding): a ratio of 1.0 earns nothing, and ``labs calibrate`` suggests full
    credit near the reference's ratio, not the ``max(1, ratio)`` of a key against torch."""
    from harness.calibrate import suggest
    with pytest.raises(ValueError, match="speedup key earns nothing from 1.0"):
        PerfThreshold(baseline="b", full_credit=0.7, zero_credit=1.2, speedup=True)
    assert PerfThreshold(baseline="b", full_credit=0.7, zero_credit=1.0, speedup=True).credit(1.0) == 0.0
    assert suggest(0.56, speedup=True) == (0.73, 1.0)
    assert suggest(0.56) == (1.3, 3.9)  # against torch: up to 30% slower than torch is full credit
    with pytest.raises(ValueError, match="within the noise"):
        suggest(0.8, speedup=True)


def test_find_root_walks_up_and_honours_env(tmp_path, monkeypatch):
    monkeypatch.delenv("LABS_COURSE", raising=False)
    (tmp_path / "labs.yaml").write_text("name: x\nlabs: {}\n")
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert manifest.find_root(tmp_path / "a" / "b") == tmp_path
    monkeypatch.setenv("LABS_COURSE", str(tmp_path / "a"))
    with pytest.raises(manifest.ManifestError, match="holds no labs.yaml"):
        manifest.find_root()


def test_manifest_errors_are_one_line_with_a_hint_naming_the_field(tmp_path):
    (tmp_path / "labs.yaml").write_text("name: x\nlabs:\n  '04': {title: t, module: m, api: [], parts: "
                                        "{A: {title: a, points: -1}}, colour: red}\n")
    with pytest.raises(manifest.ManifestError) as e:
        manifest.load(tmp_path)
    assert "\n" not in str(e.value) and "labs.04.colour" in str(e.value) and "labs.04.parts.A.points" in str(e.value)
    assert e.value.hint.startswith("fix `labs.04.")


def test_a_lab_folder_without_the_named_module_fails_validation(toy_course):
    (toy_course / "labs/07/toy.py").rename(toy_course / "labs/07/Toy.py")
    with pytest.raises(manifest.ManifestError, match=r"labs\.07\.module: 'toy' names labs/07/toy\.py, which does "
                                                     r"not exist \(labs/07 holds Toy\.py\)"):
        manifest.load(toy_course)
    (toy_course / "labs/07/Toy.py").unlink()
    (toy_course / "labs/07/test_toy_visible.py").unlink()
    (toy_course / "labs/07").rmdir()  # a tree without the lab's folder (a Gradescope zip of another lab): fine
    assert manifest.load(toy_course).lab("07").module == "toy"


def test_solved_stub_accepts_stubs_and_finished_helpers_and_refuses_solutions(toy_course):
    course = manifest.load(ROOT)
    assert [_impl.solved_stub(course, lab) for lab in course.labs.values()] == [None] * len(course.labs)
    toy = manifest.load(toy_course)
    lab = toy.lab("07")
    assert _impl.solved_stub(toy, lab) is None
    (toy_course / "labs/07/toy.py").write_text((toy_course / "solutions/07/toy.py").read_text())
    assert _impl.solved_stub(toy, lab).startswith("labs/07/toy.py looks solved: add raise(s) no NotImplementedError "
                                                     "(task(s) of labs.yaml's api")


def test_solved_stub_refuses_one_task_replaced_by_the_reference_text_while_others_remain(tmp_path):
    """Lab 01's ring_all_gather replaced by the reference's own definition, the other
    two tasks still raising: refused (labs.yaml's api names are tasks unless given)."""
    import ast
    import shutil
    for rel in ("labs.yaml", "labs/01/allreduce.py", "solutions/01/allreduce.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    course = manifest.load(tmp_path)
    lab = course.lab("01")
    assert _impl.solved_stub(course, lab) is None
    src = lambda path: {n.name: ast.get_source_segment(path.read_text(), n)
                        for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
    stub, ref = tmp_path / "labs/01/allreduce.py", tmp_path / "solutions/01/allreduce.py"
    stub.write_text(stub.read_text().replace(src(stub)["ring_all_gather"], src(ref)["ring_all_gather"]))
    assert _impl.solved_stub(course, lab).startswith("labs/01/allreduce.py looks solved: ring_all_gather raise(s) no "
                                                        "NotImplementedError (task(s) of labs.yaml's api")


def _methods_of(path, cls):
    import ast
    src = path.read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return src, {m.name: ast.get_source_segment(src, m) for m in node.body if isinstance(m, ast.FunctionDef)}


@pytest.mark.parametrize("number,cls,method", [("07", "DDP", "__init__"), ("07", "DDP", "forward"),
                                                ("08", "ColumnParallelLinear", "forward")])
def test_solved_stub_refuses_one_method_of_a_task_class_replaced_by_the_reference(tmp_path, number, cls, method):
    """A task class is graded by method: lab 07's DDP with __init__ and forward replaced by
    the reference's while no_sync still raises was shipped before. Given methods
    (labs.yaml ``given: [Class.method]``, lab 08's __init__) must stay the reference's."""
    import shutil
    lab = manifest.load(ROOT).lab(number)
    for rel in ("labs.yaml", f"labs/{number}/{lab.filename}", f"solutions/{number}/{lab.filename}"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    course = manifest.load(tmp_path)
    stub, ref = tmp_path / "labs" / number / lab.filename, tmp_path / "solutions" / number / lab.filename
    assert _impl.solved_stub(course, course.lab(number)) is None
    stub_src, mine = _methods_of(stub, cls)
    stub.write_text(stub_src.replace(mine[method], _methods_of(ref, cls)[1][method]))
    assert _impl.solved_stub(course, course.lab(number)).startswith(
        f"labs/{number}/{lab.filename} looks solved: {cls}.{method} raise(s) no NotImplementedError")
    if number == "08":   # a given method changed is refused too
        stub.write_text(stub_src.replace(mine["__init__"], mine["__init__"] + "\n        self.extra = 1"))
        assert "given ColumnParallelLinear.__init__ differ(s) from the reference" in _impl.solved_stub(
            course, course.lab(number))
