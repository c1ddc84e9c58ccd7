"""scale=None resolves to 1/D instead of 1/sqrt(D) (for every part).

Killed by: graders/04/test_part_a_torch.py::test_part_a_matches_float64_attention
("softmax scale looks wrong (1/D instead of 1/sqrt(D))").
"""
SELECT = 'test_part_a_matches_float64_attention and B1-H1-Lq1-Lk1-D16-full-bq64-bk64-fp32'
MESSAGE = 'softmax scale looks wrong (1/D instead of 1/sqrt(D))'
MUTATE = [
    ("        return 1.0 / math.sqrt(D)\n", "        return 1.0 / D\n"),
]
