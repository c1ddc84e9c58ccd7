"""op="max" reduces with a comparison, acc = (acc < incoming) ? incoming : acc (std::max), which
is not NaN-propagating: a NaN arriving from the left neighbour is dropped (one already in the
chunk is kept), so whether a rank's NaN survives depends on where it sits on the ring. The
contract's max propagates NaN like torch.maximum. Public report: ml-explore/mlx#4072
(`mx.distributed.all_max` reduces with std::max and silently drops a NaN one rank holds);
torch.fmax drops it the same way.
Caught by: test_reduce_scatter_max_propagates_nan[W2] (a NaN on each rank in turn; and
test_all_reduce_max_propagates_nan)."""
SELECT = 'test_reduce_scatter_max_propagates_nan and W2'
MESSAGE = 'max dropped a NaN'
MUTATE = [("        torch.maximum(acc, incoming, out=acc)",
           "        acc.copy_(torch.where(acc < incoming, incoming, acc))  # std::max: (a < b) ? b : a")]
