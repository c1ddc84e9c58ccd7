"""checkpoint_sequential with torch's split: n // segments blocks in each segment, the remainder in the last
(torch.utils.checkpoint.checkpoint_sequential; n=8, segments=3: 2, 2, 4). The contract refuses it: the last segment,
which runs plainly, can hold almost twice the contract's blocks and save twice as much (pytorch/pytorch#68423: 9
blocks in 5 segments split [1, 1, 1, 1, 5] instead of [1, 2, 2, 2, 2]).
Caught by: test_sequential_recomputes_each_block_outside_the_last_segment_once[n8-s3] ("torch's split")."""
SELECT = 'test_sequential_recomputes_each_block_outside_the_last_segment_once and n8-s3'
MESSAGE = "torch's split"
MUTATE = [("    bounds = [i * n // segments for i in range(segments + 1)]\n",
           "    bounds = [i * (n // segments) for i in range(segments)] + [n]\n")]
