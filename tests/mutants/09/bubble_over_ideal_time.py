"""bubble_fraction = (p - 1) / M: the bubble over the ideal time, not the idle fraction of the step.
Caught by: test_bubble_fraction ("divides by the ideal time")."""
MESSAGE = 'divides by the ideal time'
SELECT = 'test_bubble_fraction'
MUTATE = [("    return (num_stages - 1) / (num_microbatches + num_stages - 1)\n",
           "    return (num_stages - 1) / num_microbatches\n")]
