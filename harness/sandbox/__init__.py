"""The trust boundary: every line of student code runs in a sandboxed worker.

Layers, each a module (dependencies point down):

* ``wire``      the wire format: values only (JSON header + raw tensor bytes), never pickle;
* ``isolation`` namespaces, hidden paths, limits, another user, the private loopback;
* ``probes``    every measurement of student code, written once, run where the code lives;
* ``server``    the untrusted side: a launcher and its W request loops (imports the submission);
* ``client``    the trusted side: workers, proxies, and the probe calls graders use.

Graders import the names below (``from harness.sandbox import measure``); multi-rank
labs use ``harness.distributed``, which drives W servers of one worker.
"""
from .client import (VJP, Budget, Measurement, RemoteModule, RemoteObject, Sandbox, SandboxError,
                     SandboxStartError, Timed, Worker, WorkerConfig, WorkerCrashed, WorkerTimeout, call_views,
                     fill_held, gradcheck, held_bytes, held_storages, is_instance, is_remote, measure,
                     measurement_from, param_grads, reachable_bytes, resident_bytes, restart, run_probe, saved_tensors, source, timed, vjp,
                     watch_storages)
from .client import build_recompute, drive_scaler, recompute, train_steps
from .wire import NotTransferable, View, WireError, decode, dumps, encode, loads

__all__ = ["VJP", "Budget", "Measurement", "NotTransferable", "RemoteModule", "RemoteObject", "Sandbox",
           "SandboxError", "SandboxStartError", "View", "WireError", "Worker", "WorkerConfig", "WorkerCrashed",
           "WorkerTimeout", "call_views", "decode", "dumps", "encode", "fill_held", "gradcheck", "held_bytes",
           "held_storages", "is_instance", "is_remote", "loads", "measure", "measurement_from", "param_grads",
           "reachable_bytes", "resident_bytes", "restart", "run_probe", "saved_tensors", "source", "Timed", "timed", "vjp", "watch_storages",
           "build_recompute", "recompute", "drive_scaler", "train_steps"]
