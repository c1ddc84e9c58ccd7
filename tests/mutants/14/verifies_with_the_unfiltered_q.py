"""Proposals are drawn from the draft's top-k/top-p filtered q but verification receives the draft's plain
softmax at the temperature (a q other than the one sampled from, transformers #47932).
Caught by: test_accepted_counts_follow_the_overlap_of_p_and_q ("verified with that q")."""
SELECT = 'test_accepted_counts_follow_the_overlap_of_p_and_q'
MESSAGE = 'verified with that q'
MUTATE = [('            q = probs(draft(torch.tensor([feed], device=device), cache=d_cache)[0, -1])\n', '            logits = draft(torch.tensor([feed], device=device), cache=d_cache)[0, -1]\n            q = probs(logits)\n'), ('            qs.append(q)\n', '            qs.append(_probs(logits, temperature, None, None).to(torch.float64) if temperature else q)   # bug\n')]
