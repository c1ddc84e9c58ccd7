"""distillation_loss multiplies the whole loss by T^2, the hard cross-entropy included (Hinton et al.
scale only the soft term).
Caught by: test_distillation_weights_the_soft_term_by_alpha_t_squared ("T^2 multiplies only the soft term")."""
SELECT = 'test_distillation_weights_the_soft_term_by_alpha_t_squared'
MESSAGE = 'T^2 multiplies only the soft term'
MUTATE = [('    return alpha * temperature ** 2 * soft + (1 - alpha) * hard\n', '    return temperature ** 2 * (alpha * soft + (1 - alpha) * hard)        # bug: T^2 on both\n')]
