"""Bug: full recomputation counted as a second forward of the whole model, 4F, the LM head
included; Megatron recomputes the transformer layers only (3F + F - 2 V d).

Source: Narayanan et al. 2021, eq. 3 (96 B s l h^2 (1 + s/6h + V/16lh): the head term is not
recomputed).
Caught by: test_recompute_flops_equal_the_checkpointed_measurement[full].
"""
SELECT = 'test_recompute_flops_equal_the_checkpointed_measurement and full'
MESSAGE = 'LM head recomputed too'
MUTATE = [
    ('        return 3 * F_ + (F_ - 2 * cfg.vocab_size * cfg.d_model)',
     '        return 4 * F_'),
]
