"""``context_lens`` counts only the tokens computed before this forward (``c``), not the ones it computes
(``c + n``): the model's attention misses the new tokens' own keys (vLLM's ``seq_lens`` include them).
Caught by: test_model_inputs_are_the_contracts_six_tensors ("context_lens")."""
SELECT = "test_model_inputs_are_the_contracts_six_tensors"
MESSAGE = "context_lens is"
MUTATE = [("        qsl.append(qsl[-1] + n)\n        ctx.append(c + n)\n    W = max(len(t) for t in block_tables)",
           "        qsl.append(qsl[-1] + n)\n        ctx.append(max(c, 1))   # bug\n"
           "    W = max(len(t) for t in block_tables)")]
