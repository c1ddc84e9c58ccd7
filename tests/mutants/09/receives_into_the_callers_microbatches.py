"""A stage s > 0 receives each activation into the caller's ``microbatches[m]`` instead of a new
buffer: the values are right, the caller's tensors are overwritten.
Caught by: test_the_callers_microbatches_are_not_written[gpipe] ("wrote into microbatches")."""
SELECT = 'test_the_callers_microbatches_are_not_written'
MESSAGE = 'wrote into microbatches'
MUTATE = [("                x = torch.empty_like(microbatches[m])\n", "                x = microbatches[m]\n")]
