"""The averaged gradient replaces .grad instead of adding to it: two backwards before a step
keep only the second.
Caught by: test_two_backwards_accumulate_before_a_step."""
SELECT = 'test_two_backwards'
MESSAGE = 'gradient of trainable shard'
MUTATE = [("            if f.shard.grad is None:\n                f.shard.grad = out\n",
           "            if True:\n                f.shard.grad = out\n")]
