"""Bug: the objective is the mean of the Huber losses, not their sum.

Source: Besiroglu et al. 2024 ("Chinchilla Scaling: A replication attempt"): with the mean's
tiny scale L-BFGS stopped early, one reason Hoffmann et al.'s Approach 3 estimates do not fit
their own data.
Caught by: test_objective_value_and_gradient.
"""
SELECT = 'test_objective_value_and_gradient and inside-delta'
MESSAGE = 'the mean, not the sum'
MUTATE = [
    ('delta * (r.abs() - 0.5 * delta)).sum()',
     'delta * (r.abs() - 0.5 * delta)).mean()'),
]
