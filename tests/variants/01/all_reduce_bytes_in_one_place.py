"""Bug: ring_all_reduce's all-gather phase sends its whole (W, c) buffer at every step (right
values, (W+1)(W-1)c elements per rank instead of 2(W-1)c); ring_all_gather itself is fine.

Issue point 7: graded in one place, the all-reduce byte-bound test (counter and, at W=2 on a
6 MB call, the loopback). The large-tensor (deadlock) and half-precision tests grade values
only, so they pass."""
MUTATE = [("    _all_gather_chunks(out, group)\n", """    _, _, right, left = ring_neighbours(group)
    incoming = torch.empty_like(out)
    for s in range(W - 1):  # the whole buffer travels at every step
        recv_idx = (rank - s - 1) % W
        _exchange(out, incoming, right, left, group)
        out[recv_idx] = incoming[recv_idx]
""")]
BUG = True
MAY_FAIL = ["test_all_reduce_bytes_per_rank_within_ring_bound"]
SELECT = "W2 and (bytes_per_rank or deadlock or half_precision)"
