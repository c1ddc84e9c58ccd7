"""num_accepted counts every accepting coin instead of the accepted prefix: a later coin that would accept
after a rejection is counted (transformers PR #28508).
Caught by: test_one_hot_rows_give_the_targets_greedy_chain ("accepted PREFIX")."""
SELECT = 'test_one_hot_rows_give_the_targets_greedy_chain'
MESSAGE = 'accepted PREFIX'
MUTATE = [('    n = accept.to(torch.int64).cumprod(-1).sum(-1)                                  # accepted prefix (B,)\n', '    n = accept.to(torch.int64).sum(-1).clamp(max=gamma)                             # bug: every accepting coin\n')]
