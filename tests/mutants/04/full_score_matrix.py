"""Part A computes attention naively: the whole (B, H, Lq, Lk) score matrix, then
a stable softmax. Correct values, but the memory bound is broken.

Killed by: graders/04/test_part_a_torch.py::test_part_a_allocates_no_score_matrix.
"""
SELECT = 'test_part_a_allocates_no_score_matrix and full'
MESSAGE = 'the (Lq, Lk) score matrix (or a full key row) was materialised'
MUTATE = [
    ("    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)\n"
     "    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)\n"
     "    for i0 in range(0, Lq, block_q):\n",
     "    s = (q.float() @ k.float().transpose(-1, -2)) * scale                 # (B, H, Lq, Lk)\n"
     "    if is_causal:\n"
     "        rows, cols = torch.arange(Lq)[:, None], torch.arange(Lk)[None, :]\n"
     "        s = s.masked_fill(cols > rows + (Lk - Lq), float(\"-inf\"))\n"
     "    lse = torch.logsumexp(s, dim=-1)\n"
     "    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])\n"
     "    return (p @ v.float()).to(q.dtype), lse\n"
     "    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)\n"
     "    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)\n"
     "    for i0 in range(0, Lq, block_q):\n"),
]
