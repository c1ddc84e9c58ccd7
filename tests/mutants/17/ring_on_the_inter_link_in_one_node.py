"""The ring always pays the inter-node link, even when the whole group is one node (m = 1).
Caught by: test_ring_time_matches_the_closed_form."""
SELECT = 'test_ring_time_matches_the_closed_form'
MESSAGE = 'ring time'
MUTATE = [
    ('        a, b = intra if m == 1 else inter\n        return',
     '        a, b = inter\n        return'),
]
