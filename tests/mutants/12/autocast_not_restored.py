"""Backward reruns fn under whatever autocast state is active during backward, not the forward's: a forward under
autocast(bfloat16) is recomputed in float32 (and a plain forward recomputed in float16 when backward runs under
autocast), so the recomputed graph is not the forward's.
Caught by: test_checkpoint_recomputes_under_the_forwards_autocast ("autocast state not restored in backward")."""
SELECT = 'test_checkpoint_recomputes_under_the_forwards_autocast and forward-bf16'
MESSAGE = 'autocast state not restored in backward'
MUTATE = [("            with torch.enable_grad(), _autocast_as(ctx.autocast):\n",
           "            with torch.enable_grad():\n")]
