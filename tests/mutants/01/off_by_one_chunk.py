"""Off-by-one chunk index in the reduce-scatter: the chunk received is reduced into the
chunk that was just sent instead of the next one, so partial sums never meet.
Caught by: test_reduce_scatter_returns_reduced_chunk_of_rank[W2]."""
SELECT = 'test_reduce_scatter_returns_reduced_chunk_of_rank and W2'
MUTATE = [("send_idx, recv_idx = (rank - s - 1) % W, (rank - s - 2) % W",
           "send_idx, recv_idx = (rank - s - 1) % W, (rank - s - 1) % W")]
