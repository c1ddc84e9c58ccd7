"""update() grows the scale after growth_interval clean steps but does not restart the count of clean steps there:
the count runs past growth_interval, so the scale never grows again (with `>=` instead of `==` it would grow on
every clean step after the first growth).
Caught by: test_scaler_trajectory_equals_grad_scaler[grow-every-2] ("growth counter not reset after growth")."""
SELECT = 'test_scaler_trajectory_equals_grad_scaler and grow-every-2'
MESSAGE = "growth counter not reset after growth"
MUTATE = [("                self.scale_value *= self.growth_factor\n                self._clean_steps = 0\n",
           "                self.scale_value *= self.growth_factor\n")]
