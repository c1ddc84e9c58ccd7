"""Bug: only the first start of the grid is minimised.

Source: Hoffmann et al. 2022 fit from a grid of initialisations, Besiroglu et al. 2024 from
4500; one start can end in a local minimum with a dead term.
Caught by: test_every_start_runs_and_the_best_is_kept.
"""
SELECT = 'test_every_start_runs_and_the_best_is_kept'
MESSAGE = 'every start must run and the best be kept'
MUTATE = [
    ('    for start in grid:\n',
     '    for start in grid[:1]:\n'),
]
