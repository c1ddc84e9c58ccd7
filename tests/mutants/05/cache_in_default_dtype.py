"""Bug: generate builds its KVCache in torch's default dtype (float32) instead of the
model's, so the cached path breaks on a float64, bfloat16 or float16 model (the update
refuses K/V of the model's dtype with TypeError). Every generate the graders ran before
issue 13 point 9 used a float32 model, where the two agree: this survived them.

Killed by: test_generate_builds_its_cache_in_the_model_dtype (bf16, fp16),
test_generate_is_greedy_and_cache_matches_no_cache[B2-L8-N5-fp64].
"""
SELECT = 'test_generate_builds_its_cache_in_the_model_dtype and bf16'
MESSAGE = "generate's cache is not in the model's dtype"
MUTATE = [
    ("        dtype = next(model.parameters()).dtype\n",
     "        dtype = torch.get_default_dtype()  # the cache's dtype\n"),
]
