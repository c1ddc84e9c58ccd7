"""step() always unscales, even after an explicit unscale_() this iteration: the gradients are divided by the scale
twice and the update is scale times too small.
Caught by: test_scaler_trajectory_equals_grad_scaler ("unscale applied twice")."""
SELECT = 'test_scaler_trajectory_equals_grad_scaler and grow-every-2'
MESSAGE = 'unscale applied twice'
MUTATE = [("        if not self._unscaled:\n            self.unscale_(optimizer)\n",
           "        self._unscaled = False  # always unscale here\n        self.unscale_(optimizer)\n")]
