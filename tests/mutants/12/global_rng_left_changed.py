"""Backward sets the forward's RNG state without forking it (fork_rng disabled): after backward the global RNG is
back where the forward left it plus the rerun's draws, not where a direct call leaves it (the draws made between
forward and backward are replayed).
Caught by: test_checkpoint_leaves_the_global_rng_as_a_direct_call ("global RNG state changed by backward")."""
SELECT = 'test_checkpoint_leaves_the_global_rng_as_a_direct_call'
MESSAGE = 'global RNG state changed by backward'
MUTATE = [("        with torch.random.fork_rng(devices=ctx.cuda_devices):\n",
           "        with torch.random.fork_rng(devices=ctx.cuda_devices, enabled=False):\n")]
