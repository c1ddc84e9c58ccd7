"""Parameters and buffers are not broadcast from group rank 0 at construction: each rank
shards its own initial weights (pytorch/pytorch PR #178569 for buffers).
Caught by: test_construction_broadcasts_and_cuts_the_contract_shards."""
SELECT = 'test_construction_broadcasts'
MESSAGE = 'broadcast missing'
MUTATE = [("                dist.broadcast(t.data, group_src=0, group=group)\n", "                pass\n")]
