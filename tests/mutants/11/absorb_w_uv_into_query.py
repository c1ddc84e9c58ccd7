"""Bug: absorbing W_UV into the query side: the absorbed path takes the value half of
wkv_b (rows qk_nope.. of each head) as the matrix folded into the query and applies the
key half after attention (the halves swapped; it runs whenever v == qk_nope, as in
DeepSeek-V2).

Caught by: test_absorbed_equals_naive_without_cache ("the absorbed path looks like it
folds W_UV (the value half of wkv_b) into the query").
"""
SELECT = "test_absorbed_equals_naive_without_cache and ds"
MESSAGE = 'the absorbed path looks like it folds W_UV (the value half of wkv_b) into the query'
MUTATE = [("            w_uk, w_uv = w[:, :dn], w[:, dn:]                    # (H, dn, r), (H, dv, r)\n",
           "            w_uk, w_uv = w[:, dv:], w[:, :dv]                    # value half folded into q\n")]
