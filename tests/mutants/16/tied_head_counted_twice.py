"""Bug: the LM head's V x d weight counted even when it is the token embedding's (tied).

Source: summing the tensors of model.state_dict(), which lists a tied weight under both names,
where model.parameters() yields it once (PyTorch docs, Module.parameters / state_dict).
Caught by: test_param_count_equals_the_decoders_parameters[plain].
"""
SELECT = 'test_param_count_equals_the_decoders_parameters and plain'
MESSAGE = 'tied weight counted twice'
MUTATE = [
    ('    if not cfg.tied_embeddings:\n        total += V * d',
     '    if True:\n        total += V * d'),
]
