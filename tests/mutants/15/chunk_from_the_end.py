"""Rank r holds chunk W-1-r (consistent, but not the pinned layout; contract note 5).
Caught by: test_construction_broadcasts_and_cuts_the_contract_shards."""
SELECT = 'test_construction_broadcasts'
MESSAGE = 'shard layout'
MUTATE = [("shard = nn.Parameter(flat[self.rank * c:(self.rank + 1) * c].clone(), requires_grad=(k == 0))",
           "shard = nn.Parameter(flat[(self.W - 1 - self.rank) * c:(self.W - self.rank) * c].clone(), "
           "requires_grad=(k == 0))")]
