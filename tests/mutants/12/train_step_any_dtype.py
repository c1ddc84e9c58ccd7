"""train_step does not check dtype: torch.float32 (or float64) silently disables CPU autocast with a warning, so the
"mixed precision" step runs in full precision.
Caught by: test_train_step_rejects_other_dtypes ("autocast dtypes are float16 and bfloat16": expected TypeError)."""
SELECT = 'test_train_step_rejects_other_dtypes'
MESSAGE = 'autocast dtypes are float16 and bfloat16'
MUTATE = [("    if dtype not in AMP_DTYPES:\n        raise TypeError(f\"dtype must be torch.float16 or torch.bfloat16, got "
           "{dtype!r}\")\n", "")]
