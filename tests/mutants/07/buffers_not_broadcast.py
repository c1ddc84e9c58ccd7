"""Only the parameters are broadcast; buffers (here the model's scale) stay each rank's own.
Caught by: test_ranks_start_from_rank_0_parameters_and_buffers[W2] ("scale is its own after construction")."""
SELECT = 'test_ranks_start_from_rank_0_parameters_and_buffers and W2'
MUTATE = [("            for t in list(module.parameters()) + list(module.buffers()):\n",
           "            for t in list(module.parameters()):\n")]
