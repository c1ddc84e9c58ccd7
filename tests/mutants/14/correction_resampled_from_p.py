"""On a rejection the correction token is resampled from the target's p_n instead of the residual
norm(max(0, p_n - q_n)): the rejected token can come back and the output is no longer the target's
distribution (the residual is what makes speculative sampling lossless; Leviathan et al. 2023, Algorithm 1).
Caught by: test_the_correction_comes_from_the_residual ("must be drawn from the residual")."""
SELECT = 'test_the_correction_comes_from_the_residual'
MESSAGE = 'must be drawn from the residual'
MUTATE = [('    residual = (p_n - q_pad[rows, n]).clamp_min(0)\n', '    residual = p_n.clone()                                  # bug: resample p\n')]
