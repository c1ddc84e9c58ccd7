"""A real bug graded in one place: forward_flops_per_token counts the attention matmuls for the causal
half only (FlashAttention's benchmark convention). Everything built on the forward count is right
relative to it: training FLOPs are 3F (+ the recomputed FLOPs), MFU and HFU use training_flops_per_token.
Proves (issue 32, "charge one deviation once"): the training, recomputation, MFU and HFU tests accept
the contract's formula on the submission's own forward count, and the closed-form and int-type tests
grade only a plausible value, so the bug costs the forward FLOP tests and nothing else."""
BUG = True
MESSAGE = "attention counted causally"
MAY_FAIL = ["test_forward_flops_equal_flop_counter"]
SELECT = ("forward_flops or training_flops or recompute_flops or mfu or hfu or closed_forms or exact_python_ints "
          "or refusals_name_the_argument")
MUTATE = [("    return 2 * L * dense + 2 * V * d + 4 * L * s * H * hd",
           "    return 2 * L * dense + 2 * V * d + 2 * L * s * H * hd")]
