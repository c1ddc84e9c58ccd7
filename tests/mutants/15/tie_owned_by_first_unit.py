"""A parameter registered in two places belongs to the first unit that registers it (the unit
that computes with it first), not to the root: a weight shared by units b and c is sharded in
b's flat and freed after b's forward while c still reads it (FSDP's rule: a tie across units
or between a unit and the outside belongs to their lowest common unit, the root; fairscale
PR #836).
Caught by: test_tied_parameters_belong_to_the_root."""
SELECT = 'test_tied_parameters'
MESSAGE = 'belongs to the root'
MUTATE = [("            return where.pop() if len(where) == 1 else root\n", "            return min(where)\n")]
