"""The inter-node groups are made of consecutive ranks (ranks[j*n:(j+1)*n]) instead of one rank per node with
the same local rank (ranks[local_rank::L]). Caught by: test_make_hierarchy_attributes."""
SELECT = 'test_make_hierarchy_attributes'
MESSAGE = 'wrong Hierarchy.inter_group'
MUTATE = [
    ('    inter = [dist.new_group(ranks[j::L]) for j in range(L)]\n',
     '    inter = [dist.new_group(ranks[j * n:(j + 1) * n]) for j in range(L)]\n'),
]
