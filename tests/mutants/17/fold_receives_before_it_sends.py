"""In the fold of a W that is not a power of two, rank 2i receives its partner's result before it
hands over its own vector, while rank 2i+1 waits to receive that vector: both block in recv for ever
(a real deadlock among gloo ranks, as an NCCL job that hangs until its watchdog fires; the usual
"send/recv order" bug of hand-written point-to-point collectives). The run's time limit ends it and
names it a deadlock. Caught by: test_hd_all_reduce_values at W=3 (1, 2, 4 and 8 never fold)."""
SELECT = 'test_hd_all_reduce_values and W3'
MESSAGE = 'deadlock'
MUTATE = [
    ('            dist.send(buf, _peer(group, rank + 1), group=group)\n            dist.recv(buf, _peer(group, rank + 1), group=group)\n',
     '            dist.recv(buf, _peer(group, rank + 1), group=group)\n            dist.send(buf, _peer(group, rank + 1), group=group)\n'),
]
