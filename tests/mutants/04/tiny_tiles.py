"""Slow: Part A ignores block_q/block_k and walks 8 x 8 tiles ("small tiles stay in
L1"). Values, lse and the memory bound are all right, but a 256-long sequence takes
1024 tiles of a dozen small ops each instead of 16.

Caught by: test_part_a_cpu_speed_vs_sdpa (no performance credit: its time ratio to
SDPA is past zero_credit), which runs before the determinism and memory tests, where 8 x 8
tiles of 1024-long rows under the allocation tracker take minutes.
"""
SELECT = 'test_part_a_cpu_speed_vs_sdpa'
MESSAGE = 'use the default 64 x 64 tiles'
MUTATE = [
    ('            raise ValueError(f"{name} must be a positive int, got {b!r}")\n    B, H, Lq, D = q.shape\n',
     '            raise ValueError(f"{name} must be a positive int, got {b!r}")\n    B, H, Lq, D = q.shape\n'
     '    block_q = block_k = 8  # small tiles stay in L1\n'),
]
