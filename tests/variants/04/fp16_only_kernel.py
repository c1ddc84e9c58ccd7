"""A real bug graded in one place: the kernel runs both tl.dot in float16 whatever the
input dtype (a tensor-core shortcut), so float32 results are off by ~1e-3 and float16 ones
are right. The float32 value cases fail; the rules it keeps (no SDPA, no block pointers)
must not, as they accept a call right in float32 or float16 (issue 13, points 3 and 7).
"""
MUTATE = [
    ("s = tl.dot(q, kT) * sm_scale", "s = tl.dot(q.to(tl.float16), kT.to(tl.float16)) * sm_scale"),
    ("acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)",
     "acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))"),
]
BUG = True
MAY_FAIL = ["test_part_b_matches_float64_attention"]
SELECT = ("test_part_b_uses_no_block_pointers or test_part_b_does_not_call_sdpa or test_part_b_bad_args_raise "
          "or (matches_float64 and fp32)")
