"""Bug: the binomial tree's depth taken as floor(log2 W); over W ranks it is ceil(log2 W).

Source: Thakur et al. 2005 (binomial tree: ceil(lg p) steps).
Caught by: test_tree_allreduce_time (off powers of two; the crossover is graded at powers
of two, where it cannot matter).
"""
SELECT = 'test_tree_allreduce_time'
MESSAGE = 'log2 rounded down'
MUTATE = [
    ('    return (W - 1).bit_length() ',
     '    return W.bit_length() - 1 '),
]
