"""Neighbours taken as global ranks stage - 1 and stage + 1: in a sub-group the stages talk to the wrong processes.
Caught by: test_group_is_honoured (group [2, 3] of W=4 sends to ranks 0 and 1: a wrong result or a
deadlock, "neighbours are group ranks")."""
MESSAGE = 'neighbours are group ranks'
SELECT = 'test_group_is_honoured'
MUTATE = [("    peer = (lambda s: dist.get_global_rank(group, s)) if group is not None else (lambda s: s)\n",
           "    peer = lambda s: s  # noqa: E731\n")]
