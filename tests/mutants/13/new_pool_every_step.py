"""``step`` asks the model for a new K/V pool every step instead of keeping the one ``__init__`` made: the K/V of
earlier steps is gone (zeros), so every decode attends to garbage.
Caught by: test_steps_follow_the_schedule_and_fill_the_pool ("new_kv_cache after __init__")."""
SELECT = "test_steps_follow_the_schedule_and_fill_the_pool and B4-staggered"
MESSAGE = "new_kv_cache after __init__"
MUTATE = [("        logits = self.model(inputs, self.kv_cache)                  # (S, V), one call for the whole batch\n",
           "        self.kv_cache = self.model.new_kv_cache(self.block_manager.num_blocks, self.block_manager.block_size)\n"
           "        logits = self.model(inputs, self.kv_cache)                  # bug: a new pool each step\n")]
