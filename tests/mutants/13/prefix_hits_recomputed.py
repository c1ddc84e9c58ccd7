"""An admitted request recomputes its whole token list: the blocks hit in the prefix cache are reused, but
``num_computed_tokens`` starts at 0 and every token is scheduled again, so the cache saves memory and no compute
(vLLM sets ``num_computed_tokens`` to the cached tokens: ``get_computed_blocks``).
Caught by: test_prefix_hits_are_not_recomputed ("prefix hits recomputed")."""
SELECT = "test_prefix_hits_are_not_recomputed"
MESSAGE = "prefix hits recomputed"
MUTATE = [("                seq.num_computed_tokens = cached\n                seq.num_scheduled_tokens = new\n",
           "                seq.num_computed_tokens = 0\n                seq.num_scheduled_tokens = len(t)\n")]
