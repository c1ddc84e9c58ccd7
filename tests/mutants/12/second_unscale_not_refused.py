"""A second unscale_() in one iteration is not refused: the gradients are divided by the scale again (too small by
the scale) instead of raising RuntimeError.
Caught by: test_scaler_second_unscale_raises_runtime_error ("second unscale_ not refused")."""
SELECT = 'test_scaler_second_unscale_raises_runtime_error'
MESSAGE = 'second unscale_ not refused'
MUTATE = [("        if self._unscaled:\n            raise RuntimeError(\"unscale_() has already been called on this "
           "optimizer since the last update()\")\n", "")]
