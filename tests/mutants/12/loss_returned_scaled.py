"""train_step returns the scaled loss (loss * scale) instead of the loss itself: logs and schedules see a number
thousands of times too big.
Caught by: test_train_step_returns_the_unscaled_loss_of_its_forward ("loss returned scaled")."""
SELECT = 'test_train_step_returns_the_unscaled_loss_of_its_forward'
MESSAGE = 'loss returned scaled'
MUTATE = [("    return loss.detach().to(torch.float32)\n", "    return scaler.scale(loss).detach().to(torch.float32)\n")]
