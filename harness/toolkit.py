"""The grader API: the only harness module graders and visible tests import.

``graders/NN/*.py`` and ``labs/NN/test_*.py`` (and their ``conftest.py``) write
``from harness.toolkit import ...`` and nothing else of the harness
(``tests/test_architecture.py`` refuses any other ``harness`` import there). A name
a grader needs is added here first, with its group below; the modules behind it
can then move without touching a grader. Like the modules it re-exports, it is
grader-side: the sandboxed worker never sees it (not in ``isolation.worker_files()``).

Checks and inputs (``harness.testing``)
  ``DTYPES``, ``MiB``, ``devices``, ``tolerance``, ``randn``, ``call_id``,
  ``assert_close``, ``assert_memory``, ``checked``, ``measure_checked``,
  ``expect_raises``

Sandbox calls and probes (``harness.sandbox.calls``, ``.timing``; student code runs only in the worker)
  ``measure``, ``timed``, ``against_twin`` (a multi-rank baseline's time checked against its
  clean twin's), ``restart``, ``source``, ``is_instance``, ``is_remote``,
  ``vjp``, ``gradcheck``, ``param_grads``, ``saved_tensors``, ``call_views``,
  ``fill_held``, ``held_bytes``, ``held_storages``, ``watch_storages``,
  ``resident_bytes``, ``SandboxError``

Recomputation and loss scaling (``harness.sandbox.calls``; trusted modules built next to the code)
  ``build_recompute`` (trusted ``RecomputeNet`` s in the worker), ``recompute`` (one watched
  forward and backward: saved storages, kept tensors, calls by phase, RNG), ``drive_scaler``
  (a loss scaler through scripted gradients), ``train_steps`` (training steps of a trusted
  model), ``RecomputeNet``, ``GradScalerAdapter`` (``torch.amp.GradScaler``, the oracle)

Speculative decoding (``harness.sandbox.calls``; trusted table models built next to the code)
  ``build_spec_models`` (the graders' ``TableModel`` s in the worker), ``build_spec_decoders`` (the perf
  tests' target, draft and target-only baseline, in the worker or here), ``model_log`` (a model's calls,
  kept outside the objects the submission gets), ``spec_runs`` (seeded runs of a generate function)

Sharded training (``harness.sandbox.calls``; lab 15's full-parameter tagging probe)
  ``sharded_run`` (a wrapper's construction, steps and a no-grad forward around a trusted
  ``TrainNet``: full-parameter bytes held after every op, storages alive between steps,
  reduce-scatter inputs)

Oracles, in float64 (``harness.oracles``)
  ``attention``, ``causal_mask``, ``train_net`` (``TrainNet`` in float64)

Ranks of the multi-rank labs (``harness.sandbox.ranks``)
  ``run_ranks`` (``harness.sandbox.ranks.run``: ``body(rk, ...)`` on W sandboxed
  ranks), ``View`` (a view sent with its base), ``DATA_COLLECTIVES`` (the
  collectives a ring implementation may not call), ``C10D_OPS`` (dispatcher op to
  collective name), ``check_one_counter`` (both counters saw the same collectives),
  ``RankError``, ``RankTimeout``, ``Step`` (what ``rk.backward``
  saw), ``TrainNet`` (the trusted model a data-parallel grader trains), ``seeded_state`` (its
  weights drawn from a seed: a large model built on the rank, the same numbers for the oracle),
  ``digest`` (four numbers standing for a tensor a timed step returns)

Bench and allocations (``harness.bench``, ``harness.alloc``)
  ``geomean``, ``attention_flops``, ``AllocationTracker``
"""
from __future__ import annotations

from .alloc import AllocationTracker
from .bench import attention_flops, geomean
from .oracles import attention, causal_mask, train_net
from .sandbox.calls import (build_recompute, build_spec_decoders, build_spec_models, call_views, drive_scaler,
                            fill_held, gradcheck, held_bytes, held_storages, is_instance, measure, model_log,
                            param_grads, recompute, reachable_bytes, resident_bytes, restart, saved_tensors,
                            sharded_run, source, spec_runs, train_steps, vjp, watch_storages)
from .sandbox.probes.comm import C10D_OPS
from .sandbox.probes.recompute import GradScalerAdapter, RecomputeNet
from .sandbox.probes.training import TrainNet, digest, seeded_state
from .sandbox.ranks import DATA_COLLECTIVES, RankError, RankTimeout, Step, View, check_one_counter
from .sandbox.ranks import run as run_ranks
from .sandbox.timing import against_twin, timed
from .sandbox.worker import SandboxError, is_remote
from .testing import (DTYPES, MiB, assert_close, assert_memory, assert_storage_unchanged, call_id, checked, devices,
                      expect_raises, imported_names, measure_checked, one_thread, randn, tolerance)

__all__ = [
    # checks and inputs
    "DTYPES", "MiB", "devices", "tolerance", "randn", "call_id", "assert_close", "assert_memory", "checked",
    "measure_checked", "expect_raises", "assert_storage_unchanged", "imported_names", "one_thread",
    # sandbox calls and probes
    "measure", "timed", "against_twin", "restart", "source", "is_instance", "is_remote", "vjp", "gradcheck", "param_grads",
    "saved_tensors", "call_views", "fill_held", "held_bytes", "held_storages", "watch_storages", "resident_bytes",
    "SandboxError",
    # recomputation and loss scaling
    "build_recompute", "recompute", "drive_scaler", "train_steps", "RecomputeNet", "GradScalerAdapter",
    # speculative decoding
    "build_spec_models", "build_spec_decoders", "model_log", "spec_runs",
    # sharded training
    "sharded_run",
    # oracles
    "attention", "causal_mask", "train_net",
    # ranks
    "run_ranks", "View", "DATA_COLLECTIVES", "C10D_OPS", "check_one_counter", "RankError", "RankTimeout", "Step",
    "TrainNet", "seeded_state", "digest",
    # bench and allocations
    "geomean", "attention_flops", "AllocationTracker",
]
