"""Bug: MLAConfig accepts an odd qk_rope_head_dim: RoPE turns pairs, so an odd rope part
has a coordinate without a partner (the layer then fails deep inside, or leaves it
unrotated).

Caught by: test_config_rejects_bad_sizes_naming_the_field[qk_rope_head_dim=7] ("an odd
qk_rope_head_dim ... expected ValueError, nothing was raised").
"""
SELECT = "test_config_rejects_bad_sizes_naming_the_field and 7"
MESSAGE = 'an odd qk_rope_head_dim (RoPE turns pairs)): expected ValueError'
MUTATE = [("        if self.qk_rope_head_dim % 2:\n", "        if False:\n")]
