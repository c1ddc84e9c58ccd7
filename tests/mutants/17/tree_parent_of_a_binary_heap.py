"""tree_reduce takes an even relative rank v's parent as v >> 1 (a binary heap's parent) instead of the
binomial tree's v - lowbit(v), odd ranks keeping v - 1: every rank still sends one message and receives
at most two, the sum is right, and the child counts would allow a tree of height 3 at W=6; but the tree
the messages form is the path 5 -> 4 -> 2 -> 1 -> 0 of 4 hops (a wrong parent makes a deep tree;
only the parents read from the message log show it). Caught by: test_tree_reduce_fan_in_and_height."""
SELECT = 'test_tree_reduce_fan_in_and_height and W6'
MESSAGE = 'tree too tall'
MUTATE = [
    ('    m = 1\n    while m < W and (v == 0 or m < (v & -v)):\n        if v + m < W:\n            dist.recv(tmp, _peer(group, (v + m + dst) % W), group=group)\n            _combine(acc, tmp, op)\n        m <<= 1\n    if v:\n        dist.send(acc, _peer(group, (v - (v & -v) + dst) % W), group=group)\n',
     '    parent = lambda u: u - 1 if u & 1 else u >> 1\n    for u in range(1, W):\n        if parent(u) == v:\n            dist.recv(tmp, _peer(group, (u + dst) % W), group=group)\n            _combine(acc, tmp, op)\n    if v:\n        dist.send(acc, _peer(group, (parent(v) + dst) % W), group=group)\n'),
]
