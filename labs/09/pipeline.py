"""Lab 09: pipeline parallelism, GPipe and 1F1B over point-to-point messages.

A model too big for one device is cut into p consecutive stages, one per rank of a process
group; a batch is split into M microbatches that flow through the stages like an assembly
line: activations go forward to stage s + 1, their gradients come back to stage s - 1.
GPipe (Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
Parallelism", NeurIPS 2019) runs all forwards, then all backwards. 1F1B (PipeDream-Flush,
Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021)
runs a warm-up of forwards, then one forward and one backward alternately: the same
bubble, but stage s holds at most p - s microbatches' activations instead of M. It runs
inside an initialised process group (gloo on CPU, nccl on GPU) and talks only through
point-to-point messages.

Parts (see README.md)
  A  schedules as data                  pytest labs/09 -k part_a
  B  a pipeline over send and recv      pytest labs/09 -k part_b
  C  activation memory                  pytest labs/09 -k part_c

Legend: p = num_stages (the ranks of ``group``), s = stage (this rank's rank in ``group``,
0 first), M = num_microbatches (``len(microbatches)``), m a microbatch index in [0, M),
w = the warm-up count of 1F1B, ``min(p - s - 1, M)``. An action is ``("F", m)`` (the
forward of microbatch m on this stage) or ``("B", m)`` (its backward).

Errors (all three functions): ``kind`` not in ``KINDS``, ``num_stages`` not an int >= 1,
``num_microbatches`` not an int >= 1 (in ``run_pipeline``: an empty ``microbatches``) and
``stage`` outside ``[0, num_stages)`` raise ``ValueError`` naming the argument and its value,
e.g. ``"num_stages must be an int >= 1, got 0"``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

KINDS = ("gpipe", "1f1b")


# --- Part A: schedules as data, the bubble fraction, the argument checks ---
# --- Part B: run_pipeline: one training step over send / recv (isend for what goes out) ---
# --- Part C: activation memory (what run_pipeline keeps alive between actions) ---

def _check(kind, num_stages, num_microbatches, stage=None):
    """Raise ``ValueError`` naming the argument and its value for a ``kind`` not in ``KINDS``,
    ``num_stages`` or ``num_microbatches`` not an int >= 1 (a bool is not an int here), or a
    ``stage`` (when given) outside ``[0, num_stages)``. (A suggested helper; you may drop it.)"""
    raise NotImplementedError("Part A: check kind, num_stages, num_microbatches and stage; raise ValueError "
                              "naming the argument and its value")


def schedule(kind: str, num_stages: int, num_microbatches: int, stage: int) -> list[tuple[str, int]]:
    """The ordered actions of ``stage``: a list of ``("F", m)`` / ``("B", m)`` tuples, each
    microbatch m in [0, M) once forward and once backward, its forward first.

    ``"gpipe"``: all forwards in order, then all backwards in REVERSE order:
        F0, F1, ..., F(M-1), B(M-1), ..., B1, B0           (the same list on every stage)
    ``"1f1b"``: with the warm-up count ``w = min(p - s - 1, M)``:
        warm-up:      F0, ..., F(w-1)
        steady state: for i = 0, ..., M-w-1:  F(w+i), B(i)
        cool-down:    B(M-w), ..., B(M-1)
    so backwards run in FORWARD order (B0 first), the last stage (w = 0) alternates
    F0 B0 F1 B1 ..., and a stage with p - s - 1 >= M does all its forwards, then its
    backwards B0..B(M-1). (torch's ``Schedule1F1B`` counts ``min(p - s, M)`` warm-ups with a
    backward-first steady state, which gives the same list.)

    Example, p = 2, M = 3: stage 0 (w = 1): F0 F1 B0 F2 B1 B2; stage 1 (w = 0): F0 B0 F1 B1 F2 B2.
    Raises ValueError (see the module docstring) for a bad kind, count or stage.
    """
    raise NotImplementedError("Part A: validate the arguments, then build the gpipe or the 1f1b list "
                              "(w = min(p - s - 1, M) warm-up forwards, then F(w+i), B(i) pairs, then the "
                              "remaining backwards)")


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """The idle fraction of one step of either schedule: ``(p - 1) / (M + p - 1)``.

    With one forward taking t_f and one backward t_b per microbatch and stage, a step takes
    ``(M + p - 1)(t_f + t_b)`` (the first stage's last backward starts only after every
    later stage has done its part), of which each stage computes ``M (t_f + t_b)``; the rest,
    ``(p - 1)(t_f + t_b)``, is the bubble. So the idle FRACTION divides by the step time
    ``M + p - 1``, not by the ideal time M: ``(p - 1) / M`` is the bubble relative to the
    useful work (it exceeds 1 when M < p - 1), not a fraction of the step.
    p = 1 gives 0.0. Raises ValueError for ``num_stages`` or ``num_microbatches`` not an
    int >= 1 (naming the argument and value).
    """
    raise NotImplementedError("Part A: validate num_stages and num_microbatches, return (p - 1) / (M + p - 1)")


def run_pipeline(stage_module, stage, num_stages, microbatches, targets, loss_fn, kind="1f1b", group=None):
    """Run one training step (forward and backward of every microbatch) of this stage.

    stage_module: this stage's module, one tensor in, one tensor out; it may have no
    parameters (it still relays gradients). stage: this rank's rank in ``group``; num_stages:
    p, the size of ``group`` (None: the world); ranks outside ``group`` do not call this.
    microbatches: a list of M tensors on every rank, all with the same number of rows.
    targets: a list of M tensors on every rank (only the last stage reads it). loss_fn:
    ``loss_fn(out, target)`` -> a 0-dim tensor averaged over the microbatch's rows (e.g.
    ``F.mse_loss``, ``F.cross_entropy``). kind: ``"gpipe"`` or ``"1f1b"``.

    Returns, on the last stage, the detached 0-dim float tensor ``L = (1/M) sum_m L_m`` with
    ``L_m = loss_fn(out_m, targets[m])``; None on every other stage.

    Checks, on every rank and before any message: the ValueErrors of the module docstring
    (kind, num_stages, an empty ``microbatches``, stage); ``num_stages !=
    dist.get_world_size(group)`` or ``stage != dist.get_rank(group)`` raise ValueError
    naming the argument and both values.

    Each stage executes exactly ``schedule(kind, p, M, stage)``, action by action:
      ("F", m): stage 0 feeds ``microbatches[m]`` to ``stage_module``; a stage s > 0 receives
        the activation from stage s - 1 into a new tensor of ``microbatches[m].shape`` and
        ``.dtype`` (that is the shape of what it receives: it reads only ``len(microbatches)``
        and each ``.shape`` / ``.dtype``, never the values; no shape or dtype is ever sent),
        makes it require grad and calls ``stage_module`` on it ONCE (no concatenation of
        microbatches, no recomputation). A stage s < p - 1 sends the output (detached,
        contiguous) to stage s + 1; the last stage computes ``L_m / M``.
      ("B", m): the last stage backpropagates ``L_m / M``; any other stage receives the
        gradient of its output m from stage s + 1 (a tensor shaped like that output) and
        backpropagates it (``out.backward(grad)``, ``retain_graph=False``). Gradients ADD to
        each parameter's ``.grad`` as ``backward()`` does, so after the call they equal the
        gradient of the whole model's mean loss over the M microbatches (= its loss on
        ``torch.cat(microbatches)``). A stage s > 0 then sends its input's gradient to stage
        s - 1; where autograd left it None (nothing between input and output needs it) it
        sends zeros of the input's shape, or stage s - 1 waits forever. Drop microbatch m's
        input and output afterwards: no graph is kept alive after its backward.

    Messages: the neighbours are group ranks ``stage - 1`` and ``stage + 1``; ``send`` /
    ``recv`` take GLOBAL ranks: ``dist.get_global_rank(group, s)`` (or ``group_dst`` /
    ``group_src``), and pass ``group=group``. Only ``send`` / ``recv`` / ``isend`` / ``irecv``
    / ``batch_isend_irecv`` may be used, no collective (``barrier`` is allowed; the graders'
    point-to-point test makes every collective raise);
    ``torch.distributed.pipelining`` must not be used. gloo's blocking ``send`` waits until
    the matching ``recv`` has started, at any size: under 1F1B stage s sends F(m+1)'s
    activation while stage s + 1 is still waiting to send you B(m)'s gradient, so with
    blocking sends 1F1B deadlocks for every p >= 2, M >= 2. Send with ``isend`` (keep the
    sent tensor and the ``Work`` alive) and ``wait()`` every one before returning: every
    message a call sends is received within that call. Receiving with a blocking ``recv``
    is fine.

    Memory (Part C): a microbatch is held from the first tensor autograd saves in its
    ``stage_module`` call until autograd releases the last. Under ``"1f1b"`` stage s holds
    at most ``p - s`` microbatches at once (``min(p - s, M)`` at peak); under ``"gpipe"`` all
    M at its peak; nothing is held after the call returns.
    """
    raise NotImplementedError("Part B: validate, then walk schedule(kind, p, M, stage): recv or take the input, "
                              "forward, isend the output (or compute L_m / M); recv the output gradient, "
                              "backward, isend the input gradient (zeros if None); wait for every isend; "
                              "Part C: drop each microbatch's tensors after its backward")
