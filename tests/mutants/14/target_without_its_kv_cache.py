"""The target gets a fresh cache every block and re-runs the whole sequence (the emitted tokens and the
proposals): right tokens, but the verification costs a prefill of the whole prefix each block instead of
gamma + 1 positions (a speculative loop without KV-cache reuse, as in naive HF-style reimplementations
that call ``model(full_ids)`` per step).
Caught by: test_cpu_time_against_target_only_decoding ("re-runs the prefix")."""
SELECT = 'test_cpu_time_against_target_only_decoding'
MESSAGE = 'the target re-runs the prefix'
MUTATE = [('        feed = (seq + props)[t_cache.seq_len:]   # ONE target call verifies all g\n',
           '        t_cache = target.make_cache(1, total)    # bug: a fresh cache, the whole prefix re-run\n'
           '        feed = seq + props\n')]
