"""forward_kl returns the soft-target cross-entropy -sum p_T log p_S (same gradient) instead of the KL: its
value is off by the teacher's entropy and is not 0 for equal distributions (contract note 11).
Caught by: test_loss_value_is_the_token_mean_of_the_divergence ("not the soft-target cross-entropy")."""
SELECT = 'test_loss_value_is_the_token_mean_of_the_divergence and forward_kl'
MESSAGE = 'not the soft-target cross-entropy'
MUTATE = [('    return _token_mean(_kl(log_pt, log_ps), valid)\n\n\ndef reverse_kl', '    return _token_mean(-(log_pt.exp() * log_ps).sum(-1), valid)      # bug: cross-entropy\n\n\ndef reverse_kl')]
