"""1F1B warm-up of p - s - 1 forwards, not capped at M: with fewer microbatches than stages it runs forwards that do not exist.
Caught by: test_schedule_action_by_action[1f1b] (p=3, M=1: F1 and B(-1) listed: "not capped at M")."""
MESSAGE = 'not capped at M'
SELECT = 'test_schedule_action_by_action and 1f1b'
MUTATE = [("    w = min(num_stages - stage - 1, M)\n", "    w = num_stages - stage - 1\n")]
