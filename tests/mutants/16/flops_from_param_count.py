"""Bug: forward FLOPs per token as 2 x param_count plus the attention matmuls: the
parameter count is not the matmul weights (the embedding is a lookup; a position table,
biases and norms are no matmuls).

Source: Kaplan et al. 2020's C ~ 6N taken with N = param_count; contract note 2.
Caught by: test_forward_flops_equal_flop_counter[untied-bias-pos].
"""
SELECT = 'test_forward_flops_equal_flop_counter and untied-bias-pos'
MESSAGE = '2 x param_count + attention'
MUTATE = [
    ('    return 2 * L * dense + 2 * V * d + 4 * L * s * H * hd',
     '    return 2 * param_count(cfg) + 4 * L * s * H * hd'),
]
