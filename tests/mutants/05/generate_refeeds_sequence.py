"""Bug: generate builds a KVCache but resets it and feeds the whole sequence at every
step, so the tokens are right and nothing is saved: each step costs a full forward.

Killed by: test_decode_step_flops_flat_except_attention,
test_cached_step_is_a_small_fraction_of_uncached.
"""
SELECT = 'test_decode_step_flops_flat_except_attention'
MESSAGE = 'decode-step FLOPs grow with position faster than attention'
MUTATE = [
    ("        logits = model(step_input if use_cache else out, cache=cache, attention_mask=mask)\n",
     "        if cache is not None:\n"
     "            cache.reset()  # start over so that the positions line up\n"
     "        logits = model(out, cache=cache, attention_mask=mask)\n"),
]
