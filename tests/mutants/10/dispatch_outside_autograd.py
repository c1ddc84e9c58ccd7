"""The token dispatch is a plain all-to-all of detached rows, outside the autograd Function: no reverse all-to-all in
backward, so x gets no gradient from the experts of other ranks.
Caught by: test_expert_parallel_equals_single_process[W2] ("the gradient of x_r")."""
SELECT = 'test_expert_parallel_equals_single_process and W2'
MESSAGE = "the off-rank experts' part comes back through the reverse all-to-all"
MUTATE = [("            x_in = _AllToAll.apply(x[tok], send, recv, group)               # (R, d)\n",
           "            x_in = _all_to_all(x[tok].detach(), send, recv, group)\n")]
