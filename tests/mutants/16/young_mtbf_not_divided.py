"""Bug: Young's interval from the node's MTBF, not the job's: a job on n nodes fails when
any one does, so M = node_mtbf / n_nodes.

Source: Young 1974; Daly 2006 (the application's MTBF); lab-contracts.md note 11.
Caught by: test_young_interval_uses_the_jobs_mtbf.
"""
SELECT = 'test_young_interval_uses_the_jobs_mtbf'
MESSAGE = 'MTBF not divided by n_nodes'
MUTATE = [
    ('    return math.sqrt(2 * checkpoint_time * node_mtbf / n_nodes)',
     '    return math.sqrt(2 * checkpoint_time * node_mtbf)'),
]
