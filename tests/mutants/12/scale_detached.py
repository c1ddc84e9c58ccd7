"""scale(loss) returns loss.detach() * scale: the scaled loss is not differentiable, so its backward reaches no
parameter and training stops.
Caught by: test_scaler_scale_is_the_scaled_loss_and_differentiable ("scale(loss) does not require grad")."""
SELECT = 'test_scaler_scale_is_the_scaled_loss_and_differentiable'
MESSAGE = 'scale(loss) does not require grad'
MUTATE = [("        return loss * self.scale_value\n", "        return loss.detach() * self.scale_value\n")]
