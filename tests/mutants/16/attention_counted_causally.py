"""Bug: the attention matmuls counted for the causal half only, 2 L s H hd per token
instead of 4 L s H hd, although the given decoder computes the full s x s scores.

Source: the causal halving of FlashAttention's benchmark FLOP count
(Dao-AILab/flash-attention, benchmarks/benchmark_flash_attention.py, `flops(..., causal)`)
and MaxText since PR #1988 -- a legitimate convention the contract excludes (note 1).
Caught by: test_forward_flops_equal_flop_counter (training FLOPs, graded on its own forward
count too, are not charged again).
"""
SELECT = 'test_forward_flops_equal_flop_counter and plain'
MESSAGE = 'attention counted causally'
MUTATE = [
    ('    return 2 * L * dense + 2 * V * d + 4 * L * s * H * hd',
     '    return 2 * L * dense + 2 * V * d + 2 * L * s * H * hd'),
]
