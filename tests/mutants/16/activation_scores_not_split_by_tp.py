"""Bug: the attention scores' 5 a s^2 b bytes not divided by the tensor-parallel degree.

Source: Korthikanti et al. 2022, Table 2 (tensor parallelism: sbh (10 + 24/t) + 5 a s^2 b / t).
Caught by: test_activation_bytes_per_layer[none-tp].
"""
SELECT = 'test_activation_bytes_per_layer and none-tp'
MESSAGE = 'attention scores not divided by t'
MUTATE = [
    ('    scores = 5 * a * s * s * b // t ',
     '    scores = 5 * a * s * s * b '),
]
