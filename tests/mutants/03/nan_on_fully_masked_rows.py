"""Bug: no guard for a fully masked row: its max is -inf, exp(-inf - -inf) = NaN.

Caught by: test_fully_masked_rows_give_zeros_not_nan.
"""
SELECT = 'test_fully_masked_rows_give_zeros_not_nan and 5-2'
MESSAGE = 'NaN in the output'
MUTATE = [("    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n", "")]
