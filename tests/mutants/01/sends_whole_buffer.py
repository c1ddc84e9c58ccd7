"""All-gather sends every chunk it holds at each step instead of one (correct values, but
(W-1) * W * c elements per rank: not bandwidth-optimal).
Caught by: test_all_gather_is_bandwidth_optimal."""
SELECT = 'test_all_gather_is_bandwidth_optimal'
MESSAGE = 'all-gather is not bandwidth-optimal'
MUTATE = [("""    for s in range(W - 1):
        send_idx, recv_idx = (rank - s) % W, (rank - s - 1) % W
        _exchange(chunks[send_idx], chunks[recv_idx], right, left, group)""",
"""    incoming = torch.empty_like(chunks)
    for s in range(W - 1):
        send_idx, recv_idx = (rank - s) % W, (rank - s - 1) % W
        _exchange(chunks, incoming, right, left, group)  # the whole buffer travels
        chunks[recv_idx] = incoming[recv_idx]""")]
