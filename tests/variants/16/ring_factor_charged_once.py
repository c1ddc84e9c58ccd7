"""A real bug graded in one place: ring_allreduce_time's bandwidth term is n / bandwidth, the 2(W-1)/W
factor missing. dp_step_time and best_allreduce call it, and are right relative to it.
Proves (issue 32, "charge one deviation once"): the DP-step, bucket-count and best-algorithm tests accept
the contract's schedule on the submission's own ring time, and the crossover (a formula of its own) is
graded independently, so the bug costs the ring tests and the ring's refusal test (whose valid
neighbour, graded on its value first, is the same bug) and nothing else."""
BUG = True
MESSAGE = "ring factor missing"
MAY_FAIL = ["test_ring_allreduce_time", "test_collective_refusals_name_the_argument"]
SELECT = "ring or tree or dp_ or best_ or crossover"
MUTATE = [("    return 2 * (W - 1) * alpha + 2 * (W - 1) / W * n_bytes / bandwidth",
           "    return 2 * (W - 1) * alpha + n_bytes / bandwidth")]
