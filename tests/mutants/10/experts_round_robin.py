"""from_moe gives rank r the experts r, r+W, r+2W, ... (round robin) instead of the block [r*E/W, (r+1)*E/W).
Caught by: test_rank_holds_the_router_and_only_its_experts ("the output holds NaN: the rank used an expert it does not
hold": its experts r+W, ... are NaN on rank r; with values right the state check says "rank r holds experts
[r*E/W, (r+1)*E/W) in order")."""
SELECT = 'test_rank_holds_the_router_and_only_its_experts'
MESSAGE = 'the output holds NaN: the rank used an expert it does not hold'
MUTATE = [("        experts = nn.ModuleList(copy.deepcopy(moe.experts[j]) for j in range(r * n, (r + 1) * n))\n",
           "        experts = nn.ModuleList(copy.deepcopy(moe.experts[j]) for j in range(r, E, W))\n")]
