"""Backward reruns fn inside fork_rng but never sets the forward's RNG state: the recomputation draws new dropout
masks, so the gradients are those of another function.
Caught by: test_checkpoint_dropout_masks_are_the_forwards ("RNG not restored")."""
SELECT = 'test_checkpoint_dropout_masks_are_the_forwards'
MESSAGE = 'RNG not restored'
MUTATE = [("            torch.set_rng_state(ctx.cpu_rng)\n", "")]
