"""float16/bfloat16 partial sums accumulate in their own dtype, rounding after every add
(double rounding, and overflow of partial sums to inf).
Caught by: test_half_precision_accumulates_in_fp32_and_rounds_once[W3-fp16] (at W=2 one fp16 add rounds once anyway)."""
SELECT = 'test_half_precision_accumulates_in_fp32_and_rounds_once and W3-fp16'
MESSAGE = 'is not the float32 sum rounded once'
MUTATE = [("    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype",
           "    return dtype")]
