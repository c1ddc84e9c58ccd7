"""The GKD mixture is M = (1 - beta) p_T + beta p_S, the weights swapped against the loss's beta (a
reading of Eq. 1 TRL does not follow; contract note 10).
Caught by: test_gkd_mixes_probabilities_and_has_its_endpoints ("M = beta p_T + (1 - beta) p_S")."""
SELECT = 'test_gkd_mixes_probabilities_and_has_its_endpoints'
MESSAGE = 'M = beta p_T + (1 - beta) p_S'
MUTATE = [('        log_m = torch.logsumexp(torch.stack([log_pt + math.log(beta), log_ps + math.log(1 - beta)]), dim=0)\n', '        log_m = torch.logsumexp(torch.stack([log_pt + math.log(1 - beta), log_ps + math.log(beta)]), dim=0)  # bug\n')]
