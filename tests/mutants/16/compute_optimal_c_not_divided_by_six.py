"""Bug: C = 6ND misapplied: N_opt and D_opt computed from C instead of C / 6.

Source: Hoffmann et al. 2022, eq. 4 (FLOPs(N, D) ~ 6ND).
Caught by: test_compute_optimal.
"""
SELECT = 'test_compute_optimal and alpha-below-beta'
MESSAGE = 'C = 6ND misapplied'
MUTATE = [
    ('    return G * (C / 6) ** (b / (a + b)), (C / 6) ** (a / (a + b)) / G',
     '    return G * C ** (b / (a + b)), C ** (a / (a + b)) / G'),
]
