"""float16/bfloat16 partial sums accumulate (and travel) in their own dtype: every round rounds again, so the
result is not the float32 sum rounded once (NCCL accumulates half precision in float32 for the same reason).
Caught by: test_hd_all_reduce_half_precision_rounds_once."""
SELECT = 'test_hd_all_reduce_half_precision_rounds_once and W3'
MESSAGE = 'partial sums were rounded'
MUTATE = [
    ('    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype\n',
     '    return dtype\n'),
]
