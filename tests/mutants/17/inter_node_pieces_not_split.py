"""The inter-node all-reduce moves the whole chunk in every ring step (pieces of ceil(N/L) instead of
ceil(ceil(N/L)/n)): values right, 2 (n-1) ceil(N/L) elements cross nodes.
Caught by: test_hierarchical_all_reduce_elements_per_rank."""
SELECT = 'test_hierarchical_all_reduce_elements_per_rank and 8-4'
MESSAGE = 'too many elements sent for the hierarchical all-reduce'
MUTATE = [
    ('        d = -(-c // n)\n',
     '        d = c\n'),
]
