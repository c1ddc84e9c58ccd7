"""Bug: ZeRO stage 2 keeps full gradients on every rank: n (p + g) + S o, which is stage 1.

Source: Rajbhandari et al. 2020 (ZeRO), sec. 5.2: P_os+g shards the gradients too, 2 psi +
14 psi / N_d with mixed-precision Adam.
Caught by: test_zero_memory_per_stage[2].
"""
SELECT = 'test_zero_memory_per_stage and 2'
MESSAGE = 'ZeRO-2 gradients replicated'
MUTATE = [
    ('n * p + S * (g + o), S * (p + g + o))[stage]',
     'n * (p + g) + S * o, S * (p + g + o))[stage]'),
]
