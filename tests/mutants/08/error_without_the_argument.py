"""The divisibility errors say only "not divisible", naming neither the argument nor its value.
Caught by: test_sizes_that_do_not_fit_raise_value_error_naming_them ("must name the argument and value")."""
SELECT = 'test_sizes_that_do_not_fit_raise_value_error_naming_them'
MUTATE = [("        raise ValueError(f\"{what}={total} is not divisible by the group's size W={W}\")\n",
           "        raise ValueError(\"not divisible\")\n")]
