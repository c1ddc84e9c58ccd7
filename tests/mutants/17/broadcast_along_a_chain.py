"""tree_broadcast passes the tensor along a chain (v receives from v-1, sends to v+1): values right, one message
in per rank, but W-1 hops. Caught by: test_tree_broadcast_fan_out_and_height."""
SELECT = 'test_tree_broadcast_fan_out_and_height and W5'
MESSAGE = 'tree too tall (a chain?)'
MUTATE = [
    ('        dist.recv(buf, _peer(group, (v - low + src) % W), group=group)\n        tensor.copy_(buf.view(tensor.shape))\n    m = low >> 1\n    while m:\n        if v + m < W:\n            dist.send(buf, _peer(group, (v + m + src) % W), group=group)\n        m >>= 1\n',
     '        dist.recv(buf, _peer(group, (v - 1 + src) % W), group=group)\n        tensor.copy_(buf.view(tensor.shape))\n    if v + 1 < W:\n        dist.send(buf, _peer(group, (v + 1 + src) % W), group=group)\n'),
]
