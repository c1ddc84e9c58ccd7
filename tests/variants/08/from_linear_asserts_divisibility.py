"""One-change probe (issue "Graders that charge one deviation once"): both ``from_linear``s check
their split with ``assert`` (AssertionError) instead of raising the contract's ValueError. Only
the from_linear refusal family may fail; the MLP and attention refusals (Part B), whose own
checks come first, must keep their points (one AssertionError in from_linear used to fail every
refusal case in one test)."""
BUG = True
MAY_FAIL = ["test_from_linear_refuses_a_split_not_divisible_by_W"]
MESSAGE = "the contract's error for a size that does not fit is ValueError"
SELECT = "refuses"
MUTATE = [
    ("        n = _shard_size(linear.out_features, W, \"out_features\")\n",
     "        assert linear.out_features % W == 0, f\"out_features={linear.out_features} is not divisible by W={W}\"\n"
     "        n = linear.out_features // W\n"),
    ("        n = _shard_size(linear.in_features, W, \"in_features\")\n",
     "        assert linear.in_features % W == 0, f\"in_features={linear.in_features} is not divisible by W={W}\"\n"
     "        n = linear.in_features // W\n"),
]
