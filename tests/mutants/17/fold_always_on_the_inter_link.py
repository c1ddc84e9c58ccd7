"""The cost model charges halving-doubling's fold to the inter-node link whenever there is more than one node,
though with L even the pairs (2i, 2i+1) share a node. Caught by: test_halving_doubling_time_with_the_fold."""
SELECT = 'test_halving_doubling_time_with_the_fold'
MESSAGE = 'halving-doubling with the fold wrong'
MUTATE = [
    ('        a, b = intra if m == 1 or L % 2 == 0 else inter\n',
     '        a, b = intra if m == 1 else inter\n'),
]
