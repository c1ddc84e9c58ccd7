"""hierarchical_all_reduce runs its two levels the wrong way round: a reduce-scatter across nodes first
(chunks of ceil(N/n) among the ranks of the same local rank), an all-reduce of that chunk inside the
node, an all-gather across nodes. The values are right and every rank sends about as many elements
in all, but each rank sends 2 (n-1) ceil(N/n) elements to other nodes instead of 2 (n-1)
ceil(ceil(N/L)/n): the slow inter-node links carry L times what the contract allows (the point of
a hierarchical all-reduce, Horovod's NCCLHierarchicalAllreduce: only 1/L of the vector crosses
nodes per rank). Caught by: test_hierarchical_all_reduce_elements_per_rank (elements to other nodes,
read from the peers of every rank's messages)."""
SELECT = 'test_hierarchical_all_reduce_elements_per_rank and 6-3'
MESSAGE = 'too many elements sent to other nodes'
MUTATE = [
    ('''    c = -(-N // L)
    buf = torch.zeros(L * c, dtype=_acc_dtype(tensor.dtype))
    buf[:N] = tensor.reshape(-1)
    if L > 1:
        _ring_reduce_scatter(buf, L, h.local_rank, h.intra_group, op, 0)
    mine = buf[h.local_rank * c:(h.local_rank + 1) * c]
    if n > 1:  # ring all-reduce of this rank's chunk among the ranks of the same local rank
        d = -(-c // n)
        part = torch.zeros(n * d, dtype=buf.dtype)
        part[:c] = mine
        _ring_reduce_scatter(part, n, h.node, h.inter_group, op, 0)
        _ring_all_gather(part, n, h.node, h.inter_group, 0)
        mine.copy_(part[:c])
    if L > 1:
        _ring_all_gather(buf, L, h.local_rank, h.intra_group, 0)
''', '''    c = -(-N // n)
    buf = torch.zeros(n * c, dtype=_acc_dtype(tensor.dtype))
    buf[:N] = tensor.reshape(-1)
    if n > 1:
        _ring_reduce_scatter(buf, n, h.node, h.inter_group, op, 0)
    mine = buf[h.node * c:(h.node + 1) * c]
    if L > 1:
        d = -(-c // L)
        part = torch.zeros(L * d, dtype=buf.dtype)
        part[:c] = mine
        _ring_reduce_scatter(part, L, h.local_rank, h.intra_group, op, 0)
        _ring_all_gather(part, L, h.local_rank, h.intra_group, 0)
        mine.copy_(part[:c])
    if n > 1:
        _ring_all_gather(buf, n, h.node, h.inter_group, 0)
'''),
]
