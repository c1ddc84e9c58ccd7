"""SpecStats.accepted counts the correction/bonus token of each block too (n + 1 instead of n), so the
acceptance rate can exceed 1.
Caught by: test_stats_count_what_the_models_saw ("accepted counts draft tokens only")."""
SELECT = 'test_stats_count_what_the_models_saw'
MESSAGE = 'accepted counts draft tokens only'
MUTATE = [('        stats.accepted += n\n', '        stats.accepted += n + 1                     # bug: bonus counted\n')]
