"""Both neighbours start with a blocking send: with gloo a send waits for the matching
recv, so every rank waits on its right neighbour forever (a deadlock at any W >= 2).
Caught by: test_reduce_scatter_returns_reduced_chunk_of_rank[W2] (RankTimeout)."""
SELECT = 'test_reduce_scatter_returns_reduced_chunk_of_rank and W2'
MESSAGE = 'a deadlock?'
MUTATE = [(
    """    reqs = [dist.isend(send_buf, right, group=group), dist.irecv(recv_buf, left, group=group)]
    for r in reqs:
        r.wait()""",
    """    dist.send(send_buf, right, group=group)
    dist.recv(recv_buf, left, group=group)""",
)]
