"""The "avg" op divides by the number of ranks twice (once per level, or once in the partials and once at the end).
Caught by: test_hd_all_reduce_avg_divides_once."""
SELECT = 'test_hd_all_reduce_avg_divides_once and W3'
MESSAGE = 'divided by the number of ranks twice'
MUTATE = [
    ('        flat = flat / count\n',
     '        flat = flat / count / count\n'),
]
