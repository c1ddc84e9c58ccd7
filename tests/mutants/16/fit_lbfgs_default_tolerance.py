"""Bug: L-BFGS with torch's default tolerances (tolerance_grad=1e-7, tolerance_change=1e-9,
absolute): at objectives near 1e-4 it stops far above the minimum.

Source: Besiroglu et al. 2024 (the original fit "stopped early"); torch.optim.LBFGS docs;
lab-contracts.md note 12.
Caught by: test_fit_reaches_the_minimum_on_synthetic_runs (the dead-start test, graded by the
basin, is not charged again).
"""
SELECT = 'test_fit_reaches_the_minimum_on_synthetic_runs'
MESSAGE = 'the fit stopped above the minimum'
MUTATE = [
    ('max_iter=1000, tolerance_grad=1e-10, tolerance_change=1e-14,',
     'max_iter=1000,'),
]
