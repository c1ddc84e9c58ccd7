"""train_step always autocasts to float16, whatever dtype it is given: a bfloat16 step runs in float16 (and may
overflow where bfloat16 would not).
Caught by: test_train_step_matches_a_float64_reference[...-bf16] ("autocast dtype ignored")."""
SELECT = 'test_train_step_matches_a_float64_reference and cross_entropy-bf16'
MESSAGE = 'autocast dtype ignored'
MUTATE = [("    with torch.autocast(device_type=device_type, dtype=dtype):\n",
           "    with torch.autocast(device_type=device_type, dtype=torch.float16):\n")]
