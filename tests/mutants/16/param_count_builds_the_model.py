"""Bug: param_count measures instead of computing: it builds the decoder on the meta device
and sums its parameters. Right on every small config, but a measurement, not the closed form
the contract asks for (and impossible for real sizes without meta tensors).

Source: counting parameters by instantiating under accelerate's init_empty_weights / the meta
device, a common practice; lab-contracts.md section 16, "Closed forms".
Caught by: test_counts_are_closed_forms[param_count].
"""
SELECT = 'test_counts_are_closed_forms and param_count'
MESSAGE = 'built an nn.Module'
MUTATE = [
    ('    bias = 1 if cfg.bias else 0\n',
     '    with torch.device("meta"):\n        return sum(p.numel() for p in build_model(cfg).parameters())\n    bias = 1 if cfg.bias else 0\n'),
]
