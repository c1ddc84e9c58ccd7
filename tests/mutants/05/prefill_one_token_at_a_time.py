"""Slow: generate with the cache runs the prompt through the model one token at a time
(the decode path reused for the prefill). Tokens, logits, FLOPs and storage are all
right, but a 128-token prompt costs 127 extra model calls instead of one batched
forward: slower than not caching at all.

Caught by: test_cpu_speed_cached_vs_uncached_generate (no performance credit: its time
ratio to the uncached generate is past zero_credit).
"""
SELECT = 'test_cpu_speed_cached_vs_uncached_generate'
MESSAGE = 'one batched prefill (not one token at a time)'
MUTATE = [
    ("    step_input = input_ids  # the whole prompt first (prefill), then one token at a time\n",
     "    step_input = input_ids  # the whole prompt first (prefill), then one token at a time\n"
     "    if use_cache:  # prefill through the decode path: one code path for every token\n"
     "        for t in range(L - 1):\n"
     "            model(input_ids[:, t:t + 1], cache=cache,\n"
     "                  attention_mask=None if mask is None else mask[:, :t + 1])\n"
     "        step_input = input_ids[:, L - 1:]\n"),
]
