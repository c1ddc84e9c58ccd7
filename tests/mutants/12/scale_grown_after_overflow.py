"""update() multiplies the scale by growth_factor after a skipped step instead of backoff_factor: an overflow makes
the next overflow likelier.
Caught by: test_scaler_trajectory_equals_grad_scaler ("scale grown after an overflow")."""
SELECT = 'test_scaler_trajectory_equals_grad_scaler and grow-every-2'
MESSAGE = 'scale grown after an overflow'
MUTATE = [("            self.scale_value *= self.backoff_factor\n", "            self.scale_value *= self.growth_factor\n")]
