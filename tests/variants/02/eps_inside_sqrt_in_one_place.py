"""Bug: Adam's eps is added inside the square root, sqrt(v_hat + eps), instead of after it,
sqrt(v_hat) + eps (torch.optim.AdamW's formula); no other bug.

Issue "Graders that charge one deviation once": graded in one place, the eps-placement test,
whose message names it. The averaging test (eps=0.1), the per-group test (a group with
eps=1e-3), the clipping tests (clipped, small gradients) and the late-parameter test replay
it and pass: the bug is not theirs."""
MUTATE = [("            denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(eps)",
           "            denom = (v / (1 - beta2 ** t)).add_(eps).sqrt()  # eps inside the root")]
BUG = True
MESSAGE = "eps is added inside the square root"
MAY_FAIL = ["test_eps_is_added_after_the_square_root"]
SELECT = ("W2 and (matches_adamw or averaged_not_summed or param_groups or clips_by_global_norm or no_clipping) "
          "or eps_is_added or first_update or clips_only")
