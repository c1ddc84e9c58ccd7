"""Bug: the ring all-reduce's bandwidth term taken as n / bandwidth: the 2(W-1)/W factor is
missing (a ring moves each byte out twice, less 1/W).

Source: nccl-tests doc/PERFORMANCE.md: bus bandwidth = algorithm bandwidth x 2(n-1)/n for
all-reduce; Thakur et al. 2005 (reduce-scatter then all-gather).
Caught by: test_ring_allreduce_time (the DP step, graded on the submission's own ring time
too, is not charged again).
"""
SELECT = 'test_ring_allreduce_time and large-messages'
MESSAGE = 'ring factor missing'
MUTATE = [
    ('    return 2 * (W - 1) * alpha + 2 * (W - 1) / W * n_bytes / bandwidth',
     '    return 2 * (W - 1) * alpha + n_bytes / bandwidth'),
]
