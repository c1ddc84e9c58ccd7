"""Bug: k and v projections counted with n_heads heads, as in multi-head attention, not
n_kv_heads (grouped-query attention).

Source: Narayanan et al. 2021's 72 B s l h^2 formula assumes MHA and a 4h MLP; Megatron-LM's
num_floating_point_operations later gained its GQA and SwiGLU terms (Ainslie et al. 2023, GQA).
Caught by: test_forward_flops_equal_flop_counter[gqa].
"""
SELECT = 'test_forward_flops_equal_flop_counter and gqa'
MESSAGE = 'K/V projections counted with n_heads'
MUTATE = [
    ('    dense = d * H * hd + 2 * d * Hkv * hd + H * hd * d + m * d * f',
     '    dense = d * H * hd + 2 * d * H * hd + H * hd * d + m * d * f'),
]
