"""No argument checks for units (a string of units is accepted until it breaks elsewhere).
Caught by: test_bad_arguments_raise."""
SELECT = 'test_bad_arguments'
MESSAGE = 'bad arguments'
MUTATE = [("        if not isinstance(units, (list, tuple)) or not all(isinstance(u, nn.Module) for u in units):\n"
           "            raise TypeError(\"units must be a list or tuple of nn.Module\")\n", "")]
