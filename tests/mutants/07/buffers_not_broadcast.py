"""Only the parameters are broadcast; buffers (here the model's scale) stay each rank's own.
Caught by: test_ranks_start_from_rank_0_parameters_and_buffers[W2] ("the buffer scale is this rank's own after construction")."""
SELECT = 'test_ranks_start_from_rank_0_parameters_and_buffers and W2'
MESSAGE = "the buffer scale is this rank's own after construction"
MUTATE = [("            for t in list(module.parameters()) + list(module.buffers()):\n",
           "            for t in list(module.parameters()):\n")]
