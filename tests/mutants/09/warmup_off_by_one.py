"""1F1B warm-up of min(p - s, M) forwards (one too many): the schedule lists and stage memory are off by one.
Caught by: test_schedule_action_by_action[1f1b] ("one warm-up forward too many")."""
MESSAGE = 'one warm-up forward too many'
SELECT = 'test_schedule_action_by_action and 1f1b'
MUTATE = [("    w = min(num_stages - stage - 1, M)\n", "    w = min(num_stages - stage, M)\n")]
