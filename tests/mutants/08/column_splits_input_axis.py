"""ColumnParallelLinear takes input columns of the weight (the row-parallel split) instead of output rows.
Caught by: test_column_parallel_linear_matches_the_unsharded_layer[W2] ("split along the wrong axis": the shards are found before forward runs)."""
SELECT = 'test_column_parallel_linear_matches_the_unsharded_layer and W2'
MESSAGE = 'split along the wrong axis'
MUTATE = [("        n = _shard_size(linear.out_features, W, \"out_features\")\n        rows = slice(r * n, (r + 1) * n)\n"
           "        bias = None if linear.bias is None else linear.bias.detach()[rows].clone()\n"
           "        return cls(linear.weight.detach()[rows].clone(), bias, group, gather_output)\n",
           "        n = _shard_size(linear.out_features, W, \"out_features\")\n        rows = slice(r * n, (r + 1) * n)\n"
           "        bias = None if linear.bias is None else linear.bias.detach()[rows].clone()\n"
           "        m = linear.in_features // W\n"
           "        return cls(linear.weight.detach()[:, r * m:(r + 1) * m].clone(), bias, group, gather_output)\n")]
