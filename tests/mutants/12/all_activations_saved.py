"""checkpoint_sequential runs every segment plainly (no checkpoint): every block's activations are saved anyway and
nothing is recomputed.
Caught by: test_sequential_saved_bytes_within_the_bound[n9-s3] ("all activations saved anyway")."""
SELECT = 'test_sequential_saved_bytes_within_the_bound and n9-s3'
MESSAGE = 'all activations saved anyway'
MUTATE = [("        x = checkpoint(_run(blocks, bounds[i], bounds[i + 1]), x)\n",
           "        x = _run(blocks, bounds[i], bounds[i + 1])(x)\n")]
