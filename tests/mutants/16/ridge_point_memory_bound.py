"""Bug: a kernel exactly at the ridge point counted as memory-bound (> instead of >=).

Source: lab-contracts.md section 16, note 7 (Williams et al. 2009: the ridge is where the
roofs meet; the contract puts it on the compute side).
Caught by: test_roofline_ridge_point_is_compute_bound.
"""
SELECT = 'test_roofline_ridge_point_is_compute_bound'
MESSAGE = 'ridge point counted as memory-bound'
MUTATE = [
    ('bound="compute" if t_compute >= t_memory else "memory"',
     'bound="compute" if t_compute > t_memory else "memory"'),
]
