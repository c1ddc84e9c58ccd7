"""The residual subtracts the draft row of the NEXT position, q_{n+1}, instead of q_n of the rejected
position (the off-by-one of HF's _speculative_sampling, transformers PR #28166).
Caught by: test_the_correction_comes_from_the_residual ("must be drawn from the residual")."""
SELECT = 'test_the_correction_comes_from_the_residual'
MESSAGE = 'must be drawn from the residual'
MUTATE = [('    residual = (p_n - q_pad[rows, n]).clamp_min(0)\n', '    residual = (p_n - q_pad[rows, (n + 1).clamp(max=gamma)]).clamp_min(0)   # bug: q_{n+1}\n')]
