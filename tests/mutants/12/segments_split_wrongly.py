"""Segments of ceil(n / segments) blocks (n=8, segments=3: 3, 3, 2): neither the contract's split
[i*n//segments, (i+1)*n//segments) nor torch's (n//segments each, the remainder in the last).
Caught by: test_sequential_recomputes_each_block_outside_the_last_segment_once[n8-s3] ("segments split wrongly")."""
SELECT = 'test_sequential_recomputes_each_block_outside_the_last_segment_once and n8-s3'
MESSAGE = 'segments split wrongly'
MUTATE = [("    bounds = [i * n // segments for i in range(segments + 1)]\n",
           "    bounds = [min(n, i * -(-n // segments)) for i in range(segments + 1)]\n")]
