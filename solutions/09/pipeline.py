"""Lab 09 reference: pipeline parallelism, GPipe and 1F1B over point-to-point messages.

GPipe (Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
Parallelism", NeurIPS 2019): all forwards, then all backwards. 1F1B (PipeDream-Flush,
Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021): a
warm-up of forwards, then one forward and one backward alternately, so stage s holds at
most p - s microbatches' activations instead of M.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

KINDS = ("gpipe", "1f1b")


def _check(kind, num_stages, num_microbatches, stage=None):
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be an int >= 1, got {num_stages!r}")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ValueError(f"num_microbatches must be an int >= 1, got {num_microbatches!r}")
    if stage is not None and (isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < num_stages):
        raise ValueError(f"stage must be in [0, {num_stages}), got {stage!r}")


def schedule(kind: str, num_stages: int, num_microbatches: int, stage: int) -> list[tuple[str, int]]:
    """The ordered actions ``("F", m)`` / ``("B", m)`` of ``stage`` (see the module docstring)."""
    _check(kind, num_stages, num_microbatches, stage)
    M = num_microbatches
    if kind == "gpipe":
        return [("F", m) for m in range(M)] + [("B", m) for m in reversed(range(M))]
    w = min(num_stages - stage - 1, M)
    out = [("F", m) for m in range(w)]
    for i in range(M - w):
        out += [("F", w + i), ("B", i)]
    return out + [("B", m) for m in range(M - w, M)]


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """Idle fraction of a step of either schedule: ``(p - 1) / (M + p - 1)``."""
    _check("gpipe", num_stages, num_microbatches)
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def run_pipeline(stage_module, stage, num_stages, microbatches, targets, loss_fn, kind="1f1b", group=None):
    """Run one training step of this stage; returns the mean loss on the last stage, else None.

    Messages: activations go to stage + 1 and input gradients to stage - 1 with ``isend``
    (gloo's blocking ``send`` waits for its ``recv``); each is waited for before the call ends.
    Raises ValueError for a bad kind, counts or stage, before any message."""
    if isinstance(microbatches, (list, tuple)) and not microbatches:
        raise ValueError("microbatches must be a non-empty list of tensors, got []")
    M = len(microbatches)
    _check(kind, num_stages, M, stage)
    W, r = dist.get_world_size(group), dist.get_rank(group)
    if num_stages != W:
        raise ValueError(f"num_stages={num_stages} must equal the group's size {W}")
    if stage != r:
        raise ValueError(f"stage={stage} must equal this rank's rank in the group, {r}")
    first, last = stage == 0, stage == num_stages - 1
    peer = (lambda s: dist.get_global_rank(group, s)) if group is not None else (lambda s: s)
    inputs, outputs, pending = {}, {}, []
    total = None
    for action, m in schedule(kind, num_stages, M, stage):
        if action == "F":
            if first:
                x = microbatches[m]
            else:
                x = torch.empty_like(microbatches[m])
                dist.recv(x, peer(stage - 1), group=group)
                x.requires_grad_(True)
            y = stage_module(x)
            inputs[m] = x
            if last:
                loss = loss_fn(y, targets[m]) / M
                outputs[m] = loss
                total = loss.detach() if total is None else total + loss.detach()
            else:
                outputs[m] = y
                out = y.detach().contiguous()
                pending.append((dist.isend(out, peer(stage + 1), group=group), out))
        else:
            y = outputs.pop(m)
            g = None
            if not last:
                g = torch.empty_like(y)
                dist.recv(g, peer(stage + 1), group=group)
            if y.requires_grad:  # a parameter-free first stage has nothing to differentiate
                y.backward(g)
            x = inputs.pop(m)
            if not first:
                gx = x.grad if x.grad is not None else torch.zeros_like(x)
                gx = gx.contiguous()
                pending.append((dist.isend(gx, peer(stage - 1), group=group), gx))
    for work, _ in pending:
        work.wait()
    return total if last else None
