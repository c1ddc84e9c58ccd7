"""Expert parallelism sends every token to every rank (rows with no expert there come back as zeros): right values,
(W-1) * T_r * d_model elements each way instead of the off-rank assignments only.
Caught by: test_only_off_rank_assignments_travel[W2] ("sending every token to every rank")."""
SELECT = 'test_only_off_rank_assignments_travel and W2'
MESSAGE = 'sending every token to every rank'
MUTATE = [("        to_rank = keep.view(T_r, W, n).any(dim=-1)                      # (T_r, W): token t goes to rank s\n",
           "        to_rank = torch.ones(T_r, W, dtype=torch.bool, device=x.device)\n")]
