"""Bug: best_allreduce picks the tree when both times are equal (<= instead of <).

Source: lab-contracts.md section 16: "tree" iff its time is strictly smaller (at W = 2 and
n = 0 both take 2 alpha).
Caught by: test_best_allreduce.
"""
SELECT = 'test_best_allreduce'
MESSAGE = 'ties go to the ring'
MUTATE = [
    ('    return "tree" if tree < ring_allreduce_time',
     '    return "tree" if tree <= ring_allreduce_time'),
]
