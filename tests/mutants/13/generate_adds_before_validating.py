"""``generate`` adds the requests one by one, each validated by ``add_request``: when a later prompt is invalid,
the earlier ones are already queued and run with the next call (the contract validates every request first:
all or none).
Caught by: test_generate_adds_no_request_when_one_is_invalid ("validate every request first")."""
SELECT = "test_generate_adds_no_request_when_one_is_invalid"
MESSAGE = "validate every request first"
MUTATE = [("        for prompt, limit in zip(prompts, limits):                  # every request first: all or none\n"
           "            self._check_request(prompt, limit, eos_token_id)\n", "")]
