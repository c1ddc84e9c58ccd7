"""The grading seed (issue: reproducible graders): the course secret and the submission's
bytes decide the hidden inputs, so a regrade of the same file gives the same score, any
changed byte gets fresh inputs, and the seed never reaches what a student sees."""
from __future__ import annotations

import json
import stat

import pytest

from harness import grading, manifest

# ten cases whose outcome depends on the seed: a score that moves with the inputs
SEED_GRADER = '''\
import pytest

@pytest.mark.part("A")
@pytest.mark.parametrize("case", range(10))
def test_case(impl, seed, case):
    assert seed % 3, f"case {case}: this input breaks the submission"

@pytest.mark.part("B")
def test_b(impl):
    assert impl.add(1) == 2
'''


@pytest.fixture
def seeded_course(toy_course, monkeypatch):
    monkeypatch.delenv(grading.SECRET_ENV, raising=False)
    (toy_course / "graders/07/test_toy.py").write_text(SEED_GRADER)
    return toy_course


def _grade(course_root, text, tmp_path, name="sub"):
    sub = tmp_path / name / "labs" / "07"
    sub.mkdir(parents=True, exist_ok=True)
    (sub / "toy.py").write_text(text)
    course = manifest.load(course_root)
    return grading.grade(sub.parents[1], course.lab("07"), course, sandbox="process")


def test_same_submission_gets_the_same_inputs_and_score(seeded_course, tmp_path):
    code = "def add(x, y=1):\n    return x + y\n"
    runs = [_grade(seeded_course, code, tmp_path, f"s{i}") for i in range(2)]
    assert runs[0].seed == runs[1].seed
    assert [t.outcome for t in runs[0].tests] == [t.outcome for t in runs[1].tests]
    assert runs[0].score == runs[1].score
    secret = seeded_course / grading.SECRET_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(secret.read_text().strip()) == 64


def test_any_changed_byte_or_another_course_secret_gets_fresh_inputs(seeded_course, tmp_path, monkeypatch):
    code = "def add(x, y=1):\n    return x + y\n"
    course = manifest.load(seeded_course)
    lab = course.lab("07")
    secret = grading.course_secret(course)
    seeds = {grading.grading_seed(secret, lab, code.encode()),
             grading.grading_seed(secret, lab, (code + "# a comment\n").encode()),
             grading.grading_seed(b"another course", lab, code.encode())}
    assert len(seeds) == 3
    assert grading.grading_seed(secret, lab, code.encode()) == grading.grading_seed(secret, lab, code.encode())
    with_comment = _grade(seeded_course, code + "# a comment\n", tmp_path)
    assert with_comment.seed == grading.grading_seed(secret, lab, (code + "# a comment\n").encode())
    monkeypatch.setenv(grading.SECRET_ENV, "staff-kept secret")
    assert _grade(seeded_course, code, tmp_path, "env").seed == grading.grading_seed(b"staff-kept secret", lab,
                                                                                        code.encode())


def test_a_course_that_cannot_keep_a_secret_draws_a_fresh_seed_per_run(seeded_course):
    (seeded_course / ".labs-staff").write_text("not a folder")  # the secret cannot be written
    course = manifest.load(seeded_course)
    assert grading.course_secret(course) is None
    assert len({grading.grading_seed(None, course.lab("07"), b"same") for _ in range(4)}) > 1


def test_the_seed_never_reaches_a_students_results(seeded_course, tmp_path):
    result = _grade(seeded_course, "def add(x, y=1):\n    return x + y + 1\n", tmp_path)
    shown = json.dumps(result.to_gradescope())
    assert str(result.seed) not in shown, "the grading seed is in Gradescope's results.json"
    assert result.seed == grading.grading_seed(grading.course_secret(manifest.load(seeded_course)),
                                               manifest.load(seeded_course).lab("07"),
                                               b"def add(x, y=1):\n    return x + y + 1\n")


# one mutant per lab, graded twice on the tests that catch it (their inputs are drawn from
# the seed); perf tests are left out: a time ratio moves with the machine, not the seed
REAL = [("01", "floor_chunk_size", "test_reduce_scatter_returns_reduced_chunk_of_rank"),
        ("02", "pad_last_rank_only", "test_n_not_divisible_by_w_padding_never_leaks"),
        ("03", "default_scale_without_sqrt", "test_output_matches_float64_oracle"),
        ("04", "nan_fully_masked_rows", "test_part_a_matches_float64_attention"),
        ("05", "padding_keys_attended", "test_left_padded_batch_equals_each_prompt_alone"),
        ("06", "strided_groups", "test_symmetric_codes_scale_dtypes_shapes_and_range"),
        ("07", "sum_not_average", "test_matches_single_process_training_on_the_concatenated_batch and W2"),
        ("08", "column_splits_input_axis", "test_column_parallel_linear_matches_the_unsharded_layer and W2"),
        ("09", "loss_not_divided_by_m", "test_loss_and_gradients_equal_one_process and 1f1b-p2-M4"),
        ("10", "capacity_by_gate", "test_capacity_drops_the_later_tokens"),
        ("11", "kv_norm_skipped", "test_naive_matches_float64_oracle and odd-B2"),
        ("12", "rng_not_restored", "test_checkpoint_dropout_masks_are_the_forwards")]


@pytest.mark.parametrize("number, mutant, select", REAL, ids=[f"{n}-{m}" for n, m, _ in REAL])
def test_a_real_mutant_regraded_gets_the_same_score_and_a_changed_comment_fresh_inputs(
        number, mutant, select, tmp_path, monkeypatch):
    from tests.conftest import ROOT, course, materialize_mutant
    monkeypatch.setenv(grading.SECRET_ENV, "a course secret for this test")
    real = course()
    lab = real.lab(number)
    impl = materialize_mutant(ROOT / "tests" / "mutants" / number / f"{mutant}.py", lab, tmp_path)
    runs = [grading.grade(impl, lab, real, select=select) for _ in range(2)]
    assert runs[0].tests and runs[0].seed == runs[1].seed
    assert [(t.name, t.outcome) for t in runs[0].tests] == [(t.name, t.outcome) for t in runs[1].tests]
    assert runs[0].score == runs[1].score and any(t.outcome == "failed" for t in runs[0].tests)
    text = (impl / number / lab.filename).read_bytes()
    secret = grading.course_secret(real)
    assert runs[0].seed == grading.grading_seed(secret, lab, text)
    assert grading.grading_seed(secret, lab, text + b"# one changed comment\n") != runs[0].seed
    shown = json.dumps(runs[0].to_gradescope())
    assert str(runs[0].seed) not in shown
