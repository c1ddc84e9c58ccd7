"""The token losses are averaged over every position, padding included (a plain mean over the padded
length), instead of the valid tokens.
Caught by: test_loss_value_is_the_token_mean_of_the_divergence ("all positions (padding included)")."""
SELECT = 'test_loss_value_is_the_token_mean_of_the_divergence and generalized_jsd'
MESSAGE = 'all positions (padding included)'
MUTATE = [('    return torch.where(valid, per_token, 0).sum() / valid.sum().clamp_min(1)\n', '    return torch.where(valid, per_token, 0).sum() / valid.numel()      # bug: padding counted\n')]
