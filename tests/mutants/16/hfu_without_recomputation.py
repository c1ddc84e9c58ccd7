"""Bug: HFU counted without the recomputed FLOPs (it equals MFU).

Source: PaLM, appendix B: HFU includes the rematerialized FLOPs the hardware executes.
Caught by: test_hfu_counts_the_recomputed_flops.
"""
SELECT = 'test_hfu_counts_the_recomputed_flops and full'
MESSAGE = 'HFU without the recomputed FLOPs'
MUTATE = [
    ('    return training_flops_per_token(cfg, recompute) * tokens_per_second / (peak_flops * n_gpus)',
     '    return training_flops_per_token(cfg, "none") * tokens_per_second / (peak_flops * n_gpus)'),
]
