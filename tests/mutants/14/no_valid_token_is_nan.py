"""With every label ignored the mean divides 0 by 0: NaN instead of a finite 0.
Caught by: test_no_valid_token_is_a_finite_zero ("must be a finite 0")."""
SELECT = 'test_no_valid_token_is_a_finite_zero'
MESSAGE = 'must be a finite 0'
MUTATE = [('    return torch.where(valid, per_token, 0).sum() / valid.sum().clamp_min(1)\n', '    return torch.where(valid, per_token, 0).sum() / valid.sum()        # bug: 0 / 0\n')]
