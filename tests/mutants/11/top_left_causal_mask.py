"""Bug: a top-left causal mask (query i sees keys 0..i, SDPA's is_causal when Lq != Lk)
instead of bottom-right (keys 0..i + S): identical without a cache, wrong for every
multi-token append after a cached prefix.

Caught by: test_multi_token_appends_match_oracle ("causal mask looks top-left aligned").
"""
SELECT = "test_multi_token_appends_match_oracle and 5+3+1+4"
MESSAGE = 'causal mask looks top-left aligned'
MUTATE = [("        hidden = j > i + (Lk - L)                                 # (L, Lk): bottom-right causal\n",
           "        hidden = j > i                                            # (L, Lk): top-left\n")]
