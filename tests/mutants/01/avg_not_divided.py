"""op="avg" in all-reduce forgets to divide by W (returns the sum).
Caught by: test_all_reduce_avg_and_max[W2]."""
SELECT = 'test_all_reduce_avg_and_max and W2'
MESSAGE = 'never divided by W'
MUTATE = [("""    if op == "avg":
        chunks[rank] /= W
""", "")]
