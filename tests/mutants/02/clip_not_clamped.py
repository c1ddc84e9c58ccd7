"""The clip coefficient is not clamped to 1: gradients below max_grad_norm are scaled up.
Caught by: test_no_clipping_below_max_norm[W2] (and test_clips_only_the_steps_above_max_norm)."""
SELECT = 'test_no_clipping_below_max_norm and W2'
MESSAGE = 'never scale gradients up'
MUTATE = [("            coef = torch.clamp(self.max_grad_norm / (self.grad_norm + 1e-6), max=1.0)",
           "            coef = self.max_grad_norm / (self.grad_norm + 1e-6)")]
