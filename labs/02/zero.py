"""Lab 02: ZeRO stage 1, AdamW with its optimizer state sharded across ranks.

You build the optimizer of ZeRO stage 1 (Rajbhandari et al., SC 2020): every
data-parallel rank keeps the full parameters and gradients, but Adam's two
moments only for the 1/W of the elements it owns, which cuts optimizer memory
by W. It runs inside an initialised process group (gloo on CPU, nccl on GPU);
any collective may be used.

Parts (see README.md)
  A  the sharded AdamW step          pytest labs/02 -k step
  B  gradient clipping, grad_norm    pytest labs/02 -k norm
  C  optimizer-state memory          pytest labs/02 -k memory

Shape legend: N = total number of parameter elements (param-group order, then
parameter order, as one flat sequence), W = ranks in ``group``, c = ceil(N / W);
rank r owns flat elements [r*c, min((r+1)*c, N)) (the last ranks may own less, or nothing).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
    """Sum ``inp`` (W*c elements) over the group; this rank receives its chunk in ``out`` (c).
    (torch >= 2.13 calls it reduce_scatter_single; reduce_scatter_tensor is the older name.)"""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, op=dist.ReduceOp.SUM, group=group)


def all_gather(out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
    """Rank-ordered concatenation of every rank's ``inp`` (c elements) into ``out`` (W*c)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


# --- Part A: the sharded AdamW step ---
# --- Part B: gradient clipping and grad_norm (in step) ---
# --- Part C: optimizer-state memory (what __init__ and step keep) ---

class ZeroAdamW(torch.optim.Optimizer):
    """AdamW whose exp_avg / exp_avg_sq live only on the rank that owns each element.

    params: an iterable of float32 tensors or of param-group dicts (per-group ``lr``,
    ``betas``, ``eps``, ``weight_decay``). max_grad_norm: clip the averaged gradient to
    this global 2-norm (None: never clip). group: the data-parallel process group
    (None: the world); rank and W are taken within it.

    step(): the caller has NOT averaged the gradients.
      1. average each gradient over the group (a reduce-scatter of the flat gradient, / W,
         gives this rank its c averaged elements); a .grad that is None on this rank
         counts as zeros; a parameter with no grad on any rank is skipped entirely;
      2. Part B: the global 2-norm of the averaged gradient, sqrt(sum over every shard of
         its squares), in float32; store it in ``self.grad_norm`` (0-dim float32 tensor,
         same on every rank); if max_grad_norm is set, scale the gradient by
         min(1, max_grad_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ does;
      3. AdamW (torch.optim.AdamW's formula) on the owned elements only, with a step
         count per parameter:  p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
         p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)   (eps after the square root);
      4. all-gather the owned parameter elements so every rank holds identical parameters.
    Part C: between steps keep at most 12*ceil(N/W) bytes + 64 KiB of tensors.
    Raises ValueError for a negative lr/eps/weight_decay, betas outside [0, 1) or a
    non-positive max_grad_norm; TypeError for non-float32 parameters.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 max_grad_norm=None, group=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        raise NotImplementedError("Part A: validate the arguments, record the group, rank and W, and lay out "
                                  "the parameters as one flat sequence split into W ranges of ceil(N/W)")

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step (see the class docstring); returns ``closure()``'s loss or None."""
        raise NotImplementedError("Part A: average the gradients (reduce-scatter), update the owned "
                                  "elements with AdamW, all-gather the parameters; Part B: global grad norm "
                                  "and clipping")
