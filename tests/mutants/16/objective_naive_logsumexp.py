"""Bug: the log-sum-exp computed naively, log(exp(x) + exp(y) + exp(z)): it overflows to inf
once an exponent passes 709 (a line search or a start far from the optimum gets there).

Source: Hoffmann et al. 2022 write the prediction as an LSE; the stable form subtracts the max
(torch.logsumexp).
Caught by: test_objective_value_and_gradient[overflowing-exponents].
"""
SELECT = 'test_objective_value_and_gradient and overflowing-exponents'
MESSAGE = 'log-sum-exp overflowed'
MUTATE = [
    ('    pred = torch.logsumexp(torch.stack((a - alpha * logN, b - beta * logD, e.expand_as(logN))), dim=0)',
     '    pred = torch.log(torch.exp(a - alpha * logN) + torch.exp(b - beta * logD) + torch.exp(e))'),
]
