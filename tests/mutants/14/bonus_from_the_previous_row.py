"""After a full acceptance the bonus token is drawn from p_{gamma-1}, the row that verified the last
proposal, instead of p_gamma, the target's last row (vLLM calls it the bonus token; contract note 2).
Caught by: test_the_bonus_comes_from_the_targets_last_row ("must be drawn from p_gamma")."""
SELECT = 'test_the_bonus_comes_from_the_targets_last_row'
MESSAGE = 'must be drawn from p_gamma'
MUTATE = [('    p_n = target_probs[rows, n]                                                     # (B, V)\n', '    p_n = target_probs[rows, n.clamp(max=max(gamma - 1, 0))]                        # bug: p_{gamma-1}\n')]
