"""The token budget is charged one per admitted sequence instead of its new tokens, so one step can compute far
more than ``max_num_batched_tokens`` tokens (the budget bounds a forward's tokens, Orca's "max batch size" in
tokens; vLLM's ``token_budget -= num_new_tokens``).
Caught by: test_admission_stops_at_the_first_request_that_does_not_fit[budget] ("token budget exceeded")."""
SELECT = "test_admission_stops_at_the_first_request_that_does_not_fit and budget"
MESSAGE = "token budget exceeded"
MUTATE = [("                budget -= new\n", "                budget -= 1\n")]
