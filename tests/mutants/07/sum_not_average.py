"""Gradients are all-reduced (summed) but never divided by W.
Caught by: test_matches_single_process_training_on_the_concatenated_batch[W2] ("W=2 times the average")."""
SELECT = 'test_matches_single_process_training_on_the_concatenated_batch and W2'
MUTATE = [("            flat /= self.world_size\n", "")]
