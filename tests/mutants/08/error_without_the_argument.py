"""The divisibility errors say only "not divisible", naming neither the argument nor its value.
Caught by: test_from_linear_refuses_a_split_not_divisible_by_W ("must name the argument and its value")."""
SELECT = 'test_from_linear_refuses_a_split_not_divisible_by_W'
MESSAGE = 'must name the argument and its value'
MUTATE = [("        raise ValueError(f\"{what}={total} is not divisible by the group's size W={W}\")\n",
           "        raise ValueError(\"not divisible\")\n")]
