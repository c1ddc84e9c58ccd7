"""A parameter with grad None on this rank is sent as zeros but never gets the average back (its .grad stays None).
Caught by: test_unused_parameters_complete_without_a_hang[W2-cap0] ("is None after backward")."""
SELECT = 'test_unused_parameters_complete_without_a_hang and W2-cap0'
MESSAGE = 'is None after backward'
MUTATE = [("                if p.grad is None:\n                    p.grad = g.clone()\n                else:\n"
           "                    p.grad.copy_(g)\n", "                if p.grad is not None:\n"
           "                    p.grad.copy_(g)\n")]
