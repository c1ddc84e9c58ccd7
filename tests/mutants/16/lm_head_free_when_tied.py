"""Bug: the LM head's 2 V d FLOPs per token dropped when its weight is tied to the embedding.

Source: Kaplan et al. 2020 (sec. 2.1) count N without embedding parameters in C ~ 6N, which
with tied weights also drops the head's matmul; contract note 2: the head is a matmul, tied or not.
Caught by: test_forward_flops_equal_flop_counter.
"""
SELECT = 'test_forward_flops_equal_flop_counter and plain'
MESSAGE = 'LM head not counted'
MUTATE = [
    ('    return 2 * L * dense + 2 * V * d + 4 * L * s * H * hd',
     '    return 2 * L * dense + (0 if cfg.tied_embeddings else 2 * V * d) + 4 * L * s * H * hd'),
]
