"""Bug: ZeRO stage 2 shards the parameters and keeps the gradients whole: n g + S (p + o).
Equal to the right count when p == g (2 and 2 bytes), so the graders use 4-byte gradients.

Source: ZeRO sec. 5.2 (P_os+g); PyTorch FSDP's SHARD_GRAD_OP is ZeRO-2: gradients and
optimizer states sharded, parameters kept whole outside the forward/backward.
Caught by: test_zero_memory_per_stage[2].
"""
SELECT = 'test_zero_memory_per_stage and 2'
MESSAGE = 'stage 2 shards the parameters instead of the gradients'
MUTATE = [
    ('n * p + S * (g + o), S * (p + g + o))[stage]',
     'n * g + S * (p + o), S * (p + g + o))[stage]'),
]
