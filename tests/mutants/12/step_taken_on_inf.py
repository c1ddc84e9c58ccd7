"""step() calls optimizer.step() even when an inf/NaN gradient was found (it only reports the skip): the parameters
and the momentum buffers become inf/NaN.
Caught by: test_scaler_skipped_step_changes_neither_parameters_nor_optimizer_state ("step taken on inf")."""
SELECT = 'test_scaler_skipped_step_changes_neither_parameters_nor_optimizer_state'
MESSAGE = 'step taken on inf'
MUTATE = [("        if self._skipped:\n            return False\n        optimizer.step()\n        return True\n",
           "        optimizer.step()\n        return not self._skipped\n")]
