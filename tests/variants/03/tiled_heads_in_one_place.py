"""Bug: query head h reads KV head h % Hkv (KV heads tiled, [kv0, kv1, kv0, kv1]) instead of
h // (Hq // Hkv) (the repeat_interleave order, [kv0, kv0, kv1, kv1]); MQA and MHA are unaffected.

Issue "one bug graded in one place, and messages that name the bug class": a part A bug, failed
only in part A, and every failing message says so. test_query_head_uses_kv_head_h_div_group grades
it; the value, gradient and gradcheck tests need 1 < Hkv < Hq, where it must show, and replay the
tiled mapping to name it. The causal-mask tests use MQA, part B grades the module around the
submission's own grouped_query_attention (its wiring, not part A's values), and part C checks its
values on K/V equal in every KV head: all of them pass."""
MUTATE = [
    ("    qf = q.to(acc).reshape(B, Hkv, G * Lq, D)  ",
     "    qf = q.to(acc).view(B, G, Hkv, Lq, D).transpose(1, 2).reshape(B, Hkv, G * Lq, D)  "),
    ("    return out.view(B, Hq, Lq, D).to(q.dtype)",
     "    return out.view(B, Hkv, G, Lq, D).transpose(1, 2).reshape(B, Hq, Lq, D).to(q.dtype)"),
]
BUG = True
MESSAGE = "KV heads look tiled ([kv0, kv1, kv0, kv1], h % Hkv)"  # the bug class, named in every failing test
MAY_FAIL = ["test_output_matches_float64_oracle", "test_query_head_uses_kv_head_h_div_group",
            "test_kv_gradients_sum_over_their_query_heads", "test_float64_gradcheck"]
SELECT = ("output_matches or query_head_uses or causal_mask or fully_masked or kv_gradients or gradcheck "
          "or projection_shapes or module_forward or module_gradients or does_not_call "
          "or (no_tensor_larger and Lq3) or cpu_speed")
