"""Adam's eps is added inside the square root, sqrt(v_hat + eps), instead of after it (torch.optim.AdamW:
sqrt(v_hat) + eps); a common slip when AdamW is written by hand (the two agree only where eps is tiny
next to sqrt(v_hat), so small-eps tests rarely see it).
Caught by: test_eps_is_added_after_the_square_root[W1] (eps=0.05), whose message names it; every other
test passes a result that is exactly this bug's replay."""
SELECT = 'test_eps_is_added_after_the_square_root and W1'
MESSAGE = 'eps is added inside the square root'
MUTATE = [("            denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(eps)",
           "            denom = (v / (1 - beta2 ** t)).add_(eps).sqrt()")]
