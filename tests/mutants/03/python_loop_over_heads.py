"""Slow: attention one (batch, query head) at a time in a Python loop. Every value,
gradient and memory bound is right (no K/V is repeated), but a decode step launches
B * Hq small matmuls instead of one batched matmul per KV group.

Caught by: test_cpu_speed_against_sdpa (no performance credit: ~20-30x SDPA's CPU time,
past zero_credit).
"""
SELECT = 'test_cpu_speed_against_sdpa'
MESSAGE = 'never a Python loop over heads'
MUTATE = [
    ("    acc = torch.promote_types(q.dtype, torch.float32)             # fp16/bf16 -> fp32; fp64 stays\n",
     "    acc = torch.promote_types(q.dtype, torch.float32)             # fp16/bf16 -> fp32; fp64 stays\n"
     "    out = torch.empty(B, Hq, Lq, D, dtype=acc, device=q.device)\n"
     "    rows = torch.arange(Lq, device=q.device)[:, None]\n"
     "    cols = torch.arange(Lk, device=q.device)[None, :]\n"
     "    for b in range(B):  # one head at a time: easy to read\n"
     "        for h in range(Hq):\n"
     "            kh, vh = k[b, h // G].to(acc), v[b, h // G].to(acc)\n"
     "            s = (q[b, h].to(acc) @ kh.T) * scale\n"
     "            if is_causal:\n"
     "                s = s.masked_fill(cols > rows + (Lk - Lq), float('-inf'))\n"
     "            m = s.amax(dim=-1, keepdim=True)\n"
     "            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n"
     "            p = torch.exp(s - m)\n"
     "            l = p.sum(dim=-1, keepdim=True)\n"
     "            out[b, h] = (p / torch.where(l == 0, torch.ones_like(l), l)) @ vh\n"
     "    return out.to(q.dtype)\n"),
]
