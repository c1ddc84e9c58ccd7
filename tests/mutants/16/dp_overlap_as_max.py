"""Bug: the overlapped step as t_forward + max(t_backward, total communication): as if the
last bucket could overlap and buckets could run at once.

Source: the common back-of-envelope overlap estimate; lab-contracts.md note 10 (one
collective in flight, buckets in order, the last bucket never overlaps; Li et al. 2020,
PyTorch Distributed, on DDP's buckets).
Caught by: test_dp_step_time_overlapped.
"""
SELECT = 'test_dp_step_time_overlapped and comm-bound'
MESSAGE = 'fwd + max(bwd, comm) is not this model'
MUTATE = [
    ('    done = 0.0 ',
     '    if overlap:\n        return t_forward + max(t_backward, K * comm)\n    done = 0.0 '),
]
