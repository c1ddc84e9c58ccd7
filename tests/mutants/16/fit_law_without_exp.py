"""Bug: the ScalingLaw built from theta without exponentiating: E = e, A = a, B = b (theta
holds their logs).

Source: Hoffmann et al. 2022 fit (a, b, e) = (log A, log B, log E).
Caught by: test_fit_reports_its_objective_and_law.
"""
SELECT = 'test_fit_reports_its_objective_and_law'
MESSAGE = 'law built from theta without exp'
MUTATE = [
    ('ScalingLaw(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=alpha, beta=beta)',
     'ScalingLaw(E=e, A=a, B=b, alpha=alpha, beta=beta)'),
]
