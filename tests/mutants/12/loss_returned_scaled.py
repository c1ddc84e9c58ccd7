"""train_step returns the scaled loss (loss * scale) instead of the loss itself: logs and schedules see a number
thousands of times too big.
Caught by: test_train_step_matches_a_float64_reference ("loss returned scaled")."""
SELECT = 'test_train_step_matches_a_float64_reference and cross_entropy-fp16'
MUTATE = [("    return loss.detach().to(torch.float32)\n", "    return scaler.scale(loss).detach().to(torch.float32)\n")]
