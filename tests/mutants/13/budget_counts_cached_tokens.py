"""The token budget charges a request all its tokens, cached prefix included, so a request whose prefix is
cached waits although the few tokens it computes fit (vLLM counts ``num_new_tokens = num_tokens -
num_computed_tokens``).
Caught by: test_admission_stops_at_the_first_request_that_does_not_fit[budget-cached] ("counted cached tokens")."""
SELECT = "test_admission_stops_at_the_first_request_that_does_not_fit and budget-cached"
MESSAGE = "counted cached tokens"
MUTATE = [("                if new > budget or not bm.can_allocate(t):\n",
           "                if len(t) > budget or not bm.can_allocate(t):\n")]
