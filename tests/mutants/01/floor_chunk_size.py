"""Chunk size floor(N/W) instead of ceil(N/W): the buffer is too small when N is not a
multiple of W (and chunks are empty when N < W).
Caught by: test_reduce_scatter_returns_reduced_chunk_of_rank[W2] (N=3)."""
SELECT = 'test_reduce_scatter_returns_reduced_chunk_of_rank and W2'
MUTATE = [("    c = -(-N // W)  # ceil(N / W)\n    buf = torch.zeros(W * c",
           "    c = N // W\n    buf = torch.zeros(W * c")]
