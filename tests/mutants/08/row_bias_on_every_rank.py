"""RowParallelLinear adds the full bias to its partial product before the all-reduce: W times the bias.
Caught by: test_row_parallel_linear_matches_the_unsharded_layer[W2] ("the bias W=2 times")."""
SELECT = 'test_row_parallel_linear_matches_the_unsharded_layer and W2'
MESSAGE = 'the output holds the bias W=2 times'
MUTATE = [("        y = reduce_from_tp(F.linear(x, self.weight), self.group)\n        return y + self.bias if self.bias is not None else y\n",
           "        return reduce_from_tp(F.linear(x, self.weight, self.bias), self.group)\n")]
