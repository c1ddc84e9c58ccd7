"""Bug: C = 6ND misapplied: D_opt = C / N_opt, the 6 forgotten.

Source: Hoffmann et al. 2022, eq. 4 with C = 6ND.
Caught by: test_compute_optimal.
"""
SELECT = 'test_compute_optimal and alpha-above-beta'
MESSAGE = 'C = 6ND misapplied'
MUTATE = [
    ('    return G * (C / 6) ** (b / (a + b)), (C / 6) ** (a / (a + b)) / G',
     '    N = G * (C / 6) ** (b / (a + b))\n    return N, C / N'),
]
