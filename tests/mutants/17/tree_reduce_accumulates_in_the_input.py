"""tree_reduce accumulates the children's partial sums into the caller's tensor on every rank, as gloo's own
reduce does (pytorch/pytorch #76527); the contract keeps non-dst tensors unchanged.
Caught by: test_tree_reduce_leaves_other_ranks_unchanged."""
SELECT = 'test_tree_reduce_leaves_other_ranks_unchanged'
MESSAGE = "tree_reduce changed a non-dst rank's tensor"
MUTATE = [
    ('    acc = tensor.reshape(-1).to(_acc_dtype(tensor.dtype), copy=True)  # a scratch buffer\n',
     '    acc = tensor.reshape(-1) if _acc_dtype(tensor.dtype) == tensor.dtype else tensor.reshape(-1).float()\n'),
]
