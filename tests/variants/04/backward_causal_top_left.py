"""A real bug graded in one place: the backward masks P top-left (query i sees keys 0..i)
while the forward, and the lse it saved, are bottom-right. Only the Part C gradient tests
fail, naming it: "backward mask is top-left ... while the forward is bottom-right"
(issue 13, points 7 and 12).
"""
MUTATE = [
    ("                rows = torch.arange(i0, i1, device=q.device)[:, None]\n"
     "                s = s.masked_fill(cols > rows + (Lk - Lq), float(\"-inf\"))",
     "                rows = torch.arange(i0, i1, device=q.device)[:, None]\n"
     "                s = s.masked_fill(cols > rows, float(\"-inf\"))"),
]
BUG = True
MESSAGE = 'backward mask is top-left'  # the bug class, named in every failing test
MAY_FAIL = ["test_part_c_gradients_match_float64_autograd", "test_part_c_fully_masked_rows_have_zero_gradients"]
SELECT = "test_part_c and not allocates_no_score_matrix"
