"""Bug: Korthikanti's sbh (10 + 24/t) computed in floats: the count comes back a float
(and, for large sizes and t not dividing 24, not exactly the integer).

Source: Korthikanti et al. 2022, Table 2, written with 24/t; lab-contracts.md: exact integers.
Caught by: test_counts_are_exact_python_ints.
"""
SELECT = 'test_counts_are_exact_python_ints'
MESSAGE = 'exact counts must be Python ints'
MUTATE = [
    ('else 10 * sbh + 24 * sbh // t',
     'else sbh * (10 + 24 / t)'),
]
