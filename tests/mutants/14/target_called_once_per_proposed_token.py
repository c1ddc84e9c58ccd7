"""The proposals are verified one at a time, one target call per proposed token (and one for the bonus
row): the output is the target's and the cache is rolled back, but the target runs gamma + 1 sequential
calls per block, as many as target-only decoding, so speculation can only add the draft's time.
Caught by: test_cpu_time_against_target_only_decoding ("one target call per proposed token")."""
SELECT = 'test_cpu_time_against_target_only_decoding'
MESSAGE = 'one target call per proposed token'
MUTATE = [('        feed = (seq + props)[t_cache.seq_len:]   # ONE target call verifies all g\n'
           '        p = probs(target(torch.tensor([feed], device=device), cache=t_cache)[0, -(g + 1):])\n',
           '        rows = []                                # bug: one target call per proposed token\n'
           '        for j in range(g + 1):\n'
           '            feed = (seq + props[:j])[t_cache.seq_len:]\n'
           '            rows.append(target(torch.tensor([feed], device=device), cache=t_cache)[0, -1])\n'
           '        p = probs(torch.stack(rows))\n')]
