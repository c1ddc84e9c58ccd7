"""checkpoint with torch's own extra keyword: `def checkpoint(fn, *args, preserve_rng_state=True)` (the shape of
torch.utils.checkpoint.checkpoint); with the default it is the reference, with False it skips the RNG replay.
Proves: an extra optional keyword is a compatible signature (design.md: "extra optional parameters are fine"): the
API check must accept it and grade it as the reference (it scored 0/100 as "api mismatch" before the harness fix)."""
MAY_FAIL = []
SELECT = "checkpoint or sequential"
MUTATE = [("def checkpoint(fn, *args):\n", "def checkpoint(fn, *args, preserve_rng_state=True):\n"),
          ("    def forward(ctx, fn, anchor, *args):\n        ctx.fn = fn\n",
           "    def forward(ctx, fn, anchor, preserve, *args):\n"
           "        ctx.fn, ctx.preserve = fn, preserve\n"),
          ("        with torch.random.fork_rng(devices=ctx.cuda_devices):\n"
           "            torch.set_rng_state(ctx.cpu_rng)\n"
           "            for d, state in zip(ctx.cuda_devices, ctx.cuda_rng):\n"
           "                torch.cuda.set_rng_state(state, d)\n",
           "        with torch.random.fork_rng(devices=ctx.cuda_devices, enabled=ctx.preserve):\n"
           "            if ctx.preserve:\n                torch.set_rng_state(ctx.cpu_rng)\n"
           "                for d, state in zip(ctx.cuda_devices, ctx.cuda_rng):\n"
           "                    torch.cuda.set_rng_state(state, d)\n"),
          ("        return (None, None, *grads)\n", "        return (None, None, None, *grads)\n"),
          ("    return _Checkpoint.apply(fn, anchor, *args)\n",
           "    return _Checkpoint.apply(fn, anchor, bool(preserve_rng_state), *args)\n")]
