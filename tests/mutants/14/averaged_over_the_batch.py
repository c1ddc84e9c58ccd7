"""The token losses are divided by the batch size (reduction="batchmean" over sequences) instead of the
number of valid tokens (contract note 12).
Caught by: test_loss_value_is_the_token_mean_of_the_divergence ("instead of the")."""
SELECT = 'test_loss_value_is_the_token_mean_of_the_divergence and reverse_kl'
MESSAGE = 'instead of the'
MUTATE = [('    return torch.where(valid, per_token, 0).sum() / valid.sum().clamp_min(1)\n', '    return torch.where(valid, per_token, 0).sum() / valid.shape[0]     # bug: batchmean\n')]
