"""copy_to_tp and reduce_from_tp swapped in the layers: the column layer all-reduces its input forward (W times x) and the row layer never sums.
Caught by: test_column_parallel_linear_matches_the_unsharded_layer[W2] ("the output is that of W=2 times x ... f and g swapped")."""
SELECT = 'test_column_parallel_linear_matches_the_unsharded_layer and W2'
MESSAGE = 'f and g swapped'
MUTATE = [("        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)\n",
           "        y = F.linear(reduce_from_tp(x, self.group), self.weight, self.bias)\n"),
          ("        y = reduce_from_tp(F.linear(x, self.weight), self.group)\n",
           "        y = copy_to_tp(F.linear(x, self.weight), self.group)\n")]
