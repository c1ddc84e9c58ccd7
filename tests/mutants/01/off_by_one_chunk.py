"""Off-by-one chunk index in the reduce-scatter: the chunk received is reduced into the
chunk that was just sent instead of the next one, so partial sums never meet.
Caught by: test_reduce_scatter_returns_reduced_chunk_of_rank[W2] (rank r's chunk holds its own input only:
"partial sums lost on the ring")."""
SELECT = 'test_reduce_scatter_returns_reduced_chunk_of_rank and W2'
MESSAGE = 'partial sums lost on the ring'
MUTATE = [("send_idx, recv_idx = (rank - s - 1) % W, (rank - s - 2) % W",
           "send_idx, recv_idx = (rank - s - 1) % W, (rank - s - 1) % W")]
