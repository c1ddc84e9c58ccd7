"""Shortcut: a contiguous "sum" all-reduce calls dist.all_reduce (a forbidden collective).
Caught by: test_all_reduce_sum_any_size[W2] (called a collective)."""
SELECT = 'test_all_reduce_sum_any_size and W2'
MESSAGE = 'the contract forbids collectives'
MUTATE = [("""    _check(tensor, op)
    rank, W, _, _ = ring_neighbours(group)
    if W == 1 or tensor.numel() == 0:""", """    _check(tensor, op)
    rank, W, _, _ = ring_neighbours(group)
    if op == "sum" and tensor.is_contiguous() and W > 1:
        dist.all_reduce(tensor, group=group)
        return tensor
    if W == 1 or tensor.numel() == 0:""")]
