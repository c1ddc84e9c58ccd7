"""The trust boundary: every line of student code runs in a sandboxed worker.

One module per story (dependencies point down); this package re-exports nothing, so the
worker's staged copy of the harness (``isolation.stage_harness``: what the worker side
imports, found from ``server``'s imports) never carries the trusted side.

The worker side (untrusted process, staged):

* ``server``     the launcher and its W request loops (imports the submission);
* ``probes/``    every measurement of student code, written once, one module per family,
  run where the code lives; ``probes.PROBES`` is the registry;
* ``isolation``  namespaces, the allow-list root, limits, another user (both sides);
* ``wire``       the wire format: values only (JSON header + raw tensor bytes), never pickle;
* ``triton_launches`` counting Triton kernel launches.

The trusted side (the grader's process):

* ``worker``     start a worker, send requests, the proxies (``RemoteModule``, ``RemoteObject``);
* ``outside``    figures about the worker read from outside it (memory, CPU time, bytes on the wire);
* ``calls``      probe calls graders make (``measure``, ``vjp``, ``held_storages``, ...);
* ``timing``     ``timed``: candidate and baseline interleaved, cross-checked from outside;
* ``ranks``      multi-rank labs: W ranks as W request loops of one worker.

Graders reach these through ``harness.toolkit`` only.
"""
