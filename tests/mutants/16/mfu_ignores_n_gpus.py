"""Bug: MFU divided by one GPU's peak although tokens_per_second is the whole job's.

Source: PaLM, appendix B: MFU is the observed throughput over the theoretical peak of the
system (all its accelerators).
Caught by: test_mfu_is_model_flops_over_the_jobs_peak[many-gpus].
"""
SELECT = 'test_mfu_is_model_flops_over_the_jobs_peak and many-gpus'
MESSAGE = 'n_gpus ignored'
MUTATE = [
    ('    return training_flops_per_token(cfg, "none") * tokens_per_second / (peak_flops * n_gpus)',
     '    return training_flops_per_token(cfg, "none") * tokens_per_second / peak_flops'),
]
