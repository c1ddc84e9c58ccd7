"""Bug: ring_reduce_scatter returns the reduced chunk r+1 (mod W) on rank r (its buffer's rows
are rotated by one before the ring); ring_all_reduce is fine.

Issue points 7 and 12: graded in one place, the chunk-index tests, whose messages say "rank r
holds chunk r+1": the oracle comparison (W = 2..4, random inputs) and, independently, the
labelled-input test (W = 3, each returned value decodes to the flat element it came from). The
op/dtype and bandwidth tests of reduce-scatter give every rank W equal chunks, where the index
cannot matter, so they pass."""
MUTATE = [("""    chunks = _padded_chunks(tensor, W, _acc_dtype(tensor.dtype))
    _reduce_scatter_chunks(chunks, op, group)
    mine = chunks[rank]""", """    chunks = _padded_chunks(tensor, W, _acc_dtype(tensor.dtype)).roll(-1, 0)  # row i: chunk i+1
    _reduce_scatter_chunks(chunks, op, group)
    mine = chunks[rank]""")]
BUG = True
MESSAGE = 'rank r holds chunk r+1'  # the bug class, named in every failing test
MAY_FAIL = ["test_reduce_scatter_returns_reduced_chunk_of_rank",
            "test_reduce_scatter_chunk_index_read_from_labelled_input"]
SELECT = "(W3 and (reduce_scatter_returns or reduce_scatter_max)) or reduce_scatter_leaves or labelled_input"
