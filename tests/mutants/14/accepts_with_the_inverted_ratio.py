"""The acceptance test uses the inverted ratio min(1, q/p) (u * p < q), the papers' p and q swapped
(Chen et al. name the target q): a token the target forbids is then always accepted.
Caught by: test_a_proposal_the_target_forbids_is_rejected ("must be rejected")."""
SELECT = 'test_a_proposal_the_target_forbids_is_rejected'
MESSAGE = 'must be rejected'
MUTATE = [('    accept = u * q_x < p_x\n', '    accept = u * p_x < q_x                                  # bug: p and q swapped\n')]
