"""Bug: the softmax scale is 1/sqrt(qk_nope_head_dim), as if the head were only its nope
part; the score is a dot product over qk_nope + qk_rope dims, so the scale is
1/sqrt(qk_nope + qk_rope).

Caught by: test_naive_matches_float64_oracle ("the scale looks like 1/sqrt(qk_nope_head_dim)").
"""
SELECT = "test_naive_matches_float64_oracle and odd-B2"
MESSAGE = 'the scale looks like 1/sqrt(qk_nope_head_dim)'
MUTATE = [("        scale = 1.0 / math.sqrt(dn + dr)\n", "        scale = 1.0 / math.sqrt(dn)\n")]
