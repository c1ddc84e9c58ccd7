"""update() never backs the scale off below 1 (a min_scale=1 floor, as in mmdetection's and Megatron-LM's legacy
dynamic loss scalers): the contract's scale, like torch.amp.GradScaler's, has no floor, so after overflows at a
scale of 1 or less the two trajectories part.
Caught by: test_scaler_backoff_has_no_floor ("backoff floored at a minimum scale")."""
SELECT = 'test_scaler_backoff_has_no_floor'
MESSAGE = "backoff floored at a minimum scale"
MUTATE = [("            self.scale_value *= self.backoff_factor\n",
           "            self.scale_value = max(1.0, self.scale_value * self.backoff_factor)  # min_scale=1\n")]
