"""DynamicLossScaler accepts any backoff_factor (0, 1 or more): a factor >= 1 never backs off, 0 kills the scale.
Caught by: test_scaler_rejects_bad_arguments ("backoff_factor outside (0, 1)": expected ValueError)."""
SELECT = 'test_scaler_rejects_bad_arguments'
MESSAGE = 'backoff_factor outside (0, 1)'
MUTATE = [("        if not 0 < backoff_factor < 1:\n            raise ValueError(f\"backoff_factor must be in (0, 1), got "
           "{backoff_factor!r}\")\n", "")]
