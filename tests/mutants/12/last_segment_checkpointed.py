"""checkpoint_sequential checkpoints the last segment too: its blocks are recomputed in backward right after their
own forward, for no memory gain.
Caught by: test_sequential_recomputes_each_block_outside_the_last_segment_once[n8-s3] ("last segment checkpointed")."""
SELECT = 'test_sequential_recomputes_each_block_outside_the_last_segment_once and n8-s3'
MESSAGE = 'last segment checkpointed'
MUTATE = [("    for i in range(segments - 1):\n        x = checkpoint(_run(blocks, bounds[i], bounds[i + 1]), x)\n"
           "    return _run(blocks, bounds[-2], n)(x)\n",
           "    for i in range(segments):\n        x = checkpoint(_run(blocks, bounds[i], bounds[i + 1]), x)\n"
           "    return x\n")]
