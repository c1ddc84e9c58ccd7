"""One-change probe (issue "Graders that charge one deviation once", lab 09): a wrong schedule
order, ``schedule`` giving 1F1B a warm-up of ``min(p - s, M)`` forwards with the contract's
forward-first steady state (one forward too many), executed faithfully by ``run_pipeline``. Only
the schedule is wrong: the list (Part A) and the order each stage ran (Part B) may charge it; the
values, messages and completion are right, and each microbatch is still freed with its backward
(Part C grades the activations held against the order the stage ran, not the contract's order)."""
BUG = True
MAY_FAIL = ["test_schedule_action_by_action", "test_each_stage_executes_its_schedule"]
MESSAGE = "one warm-up forward too many"
SELECT = "schedule or bad_arguments or loss_and_gradients or frees or deadlock"
MUTATE = [("    w = min(num_stages - stage - 1, M)\n", "    w = min(num_stages - stage, M)\n")]
