"""train_step returns the scaled loss divided by the scale read after scaler.update() (facebookresearch/fairchem#617):
right while the scale stays, off by the growth or backoff factor exactly on the steps where the scale changes.
Caught by: test_train_step_returns_the_unscaled_loss_of_its_forward ("loss unscaled with the scale after update()")."""
SELECT = 'test_train_step_returns_the_unscaled_loss_of_its_forward'
MESSAGE = "loss unscaled with the scale after update()"
MUTATE = [("    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n"
           "    return loss.detach().to(torch.float32)\n",
           "    scaled = scaler.scale(loss)\n    scaled.backward()\n    scaler.step(optimizer)\n    scaler.update()\n"
           "    return (scaled.detach() / scaler.scale_value).to(torch.float32)\n")]
