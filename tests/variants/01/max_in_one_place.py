"""Bug: op="max" rebinds a local name (``acc = torch.maximum(acc, incoming)``) instead of writing
into the chunk, so a rank's chunk keeps its own values: every "max" result is wrong, "sum" and
"avg" are right.

Issue point 7: graded in one place per function, the max tests of reduce-scatter and all-reduce
(the op tests, and the NaN tests: a max that never reduces drops the other ranks' NaNs too).
The strided-view and every-dtype tests reduce with "sum" only, so they pass."""
MUTATE = [("        torch.maximum(acc, incoming, out=acc)",
           "        acc = torch.maximum(acc, incoming)  # noqa: F841 - the chunk never changes")]
BUG = True
MAY_FAIL = ["test_reduce_scatter_max_avg_and_dtypes", "test_all_reduce_avg_and_max",
            "test_reduce_scatter_max_propagates_nan", "test_all_reduce_max_propagates_nan"]
SELECT = ("(reduce_scatter_max and W3) or (strided_views and transposed) or (every_dtype and (fp32 or int32)) "
          "or (propagates_nan and W2)")
