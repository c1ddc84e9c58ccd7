"""Bug: MFU computed with the recomputed FLOPs (training_flops_per_token(cfg, recompute)),
which is HFU.

Source: Chowdhery et al. 2022 (PaLM), appendix B: MFU counts the model's FLOPs only, "not
including rematerialization".
Caught by: test_mfu_ignores_recompute.
"""
SELECT = 'test_mfu_ignores_recompute and full'
MESSAGE = 'MFU counted with recomputation'
MUTATE = [
    ('    return training_flops_per_token(cfg, "none") * tokens_per_second / (peak_flops * n_gpus)',
     '    return training_flops_per_token(cfg, recompute) * tokens_per_second / (peak_flops * n_gpus)'),
]
