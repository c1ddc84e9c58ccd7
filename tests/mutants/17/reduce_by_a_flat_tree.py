"""tree_reduce receives every rank's vector at dst (a flat tree: fan-in W-1, the root's link carries everything).
Caught by: test_tree_reduce_fan_in_and_height."""
SELECT = 'test_tree_reduce_fan_in_and_height and W6'
MESSAGE = 'fan-out/fan-in above ceil(log2 W)'
MUTATE = [
    ('    m = 1\n    while m < W and (v == 0 or m < (v & -v)):\n        if v + m < W:\n            dist.recv(tmp, _peer(group, (v + m + dst) % W), group=group)\n            _combine(acc, tmp, op)\n        m <<= 1\n    if v:\n        dist.send(acc, _peer(group, (v - (v & -v) + dst) % W), group=group)\n',
     '    if v == 0:\n        for u in range(1, W):\n            dist.recv(tmp, _peer(group, (u + dst) % W), group=group)\n            _combine(acc, tmp, op)\n    if v:\n        dist.send(acc, _peer(group, dst), group=group)\n'),
]
