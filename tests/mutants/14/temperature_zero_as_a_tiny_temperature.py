"""temperature 0 is replaced by a tiny temperature (1e-5): tied maxima split the mass instead of a one-hot
at the first maximum (contract note 6).
Caught by: test_temperature_zero_is_one_hot_at_the_first_maximum ("FIRST maximal")."""
SELECT = 'test_temperature_zero_is_one_hot_at_the_first_maximum'
MESSAGE = 'FIRST maximal'
MUTATE = [('        return F.one_hot(z.argmax(-1), z.shape[-1]).to(out_dtype)\n', '        temperature = 1e-5                                      # bug: a tiny temperature\n')]
