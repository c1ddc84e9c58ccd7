"""Chunk size floor(N/W) instead of ceil(N/W): the last N % W elements are silently dropped
(the buffer holds W * floor(N/W) of them) and every chunk is too short when N is not a multiple
of W (empty when N < W).
Caught by: test_reduce_scatter_returns_reduced_chunk_of_rank[W2] (N=1: a chunk of 0 elements)."""
SELECT = 'test_reduce_scatter_returns_reduced_chunk_of_rank and W2'
MESSAGE = 'must return a 1-D tensor of ceil(N/W) elements'
MUTATE = [("""    c = -(-N // W)  # ceil(N / W)
    buf = torch.zeros(W * c, dtype=dtype, device=tensor.device)
    buf[:N] = tensor.reshape(-1)""", """    c = N // W  # floor: the last N % W elements are dropped
    buf = torch.zeros(W * c, dtype=dtype, device=tensor.device)
    buf[:] = tensor.reshape(-1)[:W * c]""")]
