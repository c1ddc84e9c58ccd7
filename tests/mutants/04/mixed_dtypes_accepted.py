"""Input validation forgets that k and v must have q's dtype: a float16 k with a
float32 q is silently accepted (and upcast) instead of raising TypeError naming k.

Killed by: graders/04/test_part_a_torch.py::test_part_a_bad_args_raise[k-dtype-differs].
"""
SELECT = 'test_part_a_bad_args_raise and k-dtype-differs'
MESSAGE = 'k-dtype-differs (an error naming k): expected TypeError'
MUTATE = [
    ("        if t.dtype != q.dtype:\n", "        if False:\n"),
]
