"""Gradients reduce-scattered (summed) but never divided by W (the classic data-parallel bug).
Caught by: test_matches_single_process_training[W2]."""
SELECT = 'test_matches_single_process_training and W2'
MESSAGE = 'the gradients are summed, not averaged'
MUTATE = [("            out.div_(self.W)\n", "")]
