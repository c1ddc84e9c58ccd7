"""Part A forgets the softmax scale (uses q . k instead of q . k / sqrt(D)).

Killed by: graders/04/test_part_a_torch.py::test_part_a_matches_float64_attention
("softmax scale looks wrong (no scale at all)").
"""
SELECT = 'test_part_a_matches_float64_attention and B1-H1-Lq1-Lk1-D16-full-bq64-bk64-fp32'
MESSAGE = 'softmax scale looks wrong (no scale at all)'
MUTATE = [
    ("qi = q[:, :, i0:i1].float() * scale", "qi = q[:, :, i0:i1].float()"),
]
