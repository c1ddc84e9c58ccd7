"""update() backs off after an overflow but does not restart the count of clean steps: the scale grows again after
fewer than growth_interval clean steps in a row.
Caught by: test_scaler_trajectory_equals_grad_scaler[grow-every-2] ("growth counter not reset after a backoff")."""
SELECT = 'test_scaler_trajectory_equals_grad_scaler and grow-every-2'
MESSAGE = 'growth counter not reset after a backoff'
MUTATE = [("            self.scale_value *= self.backoff_factor\n            self._clean_steps = 0\n",
           "            self.scale_value *= self.backoff_factor\n")]
