"""Bug: Huber residuals of the loss (exp(LSE) - L) instead of the log-loss (LSE - log L).

Source: Hoffmann et al. 2022, eq. 3 (Huber loss between the LSE prediction and log L_i).
Caught by: test_objective_value_and_gradient.
"""
SELECT = 'test_objective_value_and_gradient and outside-delta'
MESSAGE = 'residuals of the loss, not of log-loss'
MUTATE = [
    ('    r = pred - logL ',
     '    r = pred.exp() - logL.exp() '),
]
