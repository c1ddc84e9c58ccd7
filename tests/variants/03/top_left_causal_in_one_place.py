"""Bug: the causal mask is aligned top-left (query i sees keys 0..i, SDPA's is_causal) instead of
bottom-right (keys 0..i + Lk - Lq); the two agree only when Lq == Lk.

Issue point 7: graded in one place, the causal-mask tests (fully masked rows exist only under
the bottom-right mask). The value, MQA/MHA, gradient, gradcheck and memory tests use square or
non-causal calls, where the alignment cannot matter, so they pass."""
MUTATE = [("s = s.masked_fill(j > i + (Lk - Lq), float(\"-inf\"))", "s = s.masked_fill(j > i, float(\"-inf\"))")]
BUG = True
MESSAGE = 'causal mask looks top-left aligned'  # the bug class, named in every failing test
MAY_FAIL = ["test_causal_mask_is_bottom_right_aligned", "test_fully_masked_rows_give_zeros_not_nan"]
SELECT = ("output_matches or mqa_and_mha or causal_mask or fully_masked or kv_gradients or gradcheck "
          "or (no_tensor_larger and Lq3)")
