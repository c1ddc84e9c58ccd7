"""Gradients are all-reduced (summed) but never divided by W.
Caught by: test_matches_single_process_training_on_the_concatenated_batch[W2] ("W=2 times the average ... the gradients are summed, not averaged")."""
SELECT = 'test_matches_single_process_training_on_the_concatenated_batch and W2'
MESSAGE = 'the gradients are summed, not averaged'
MUTATE = [("            flat /= self.world_size\n", "")]
