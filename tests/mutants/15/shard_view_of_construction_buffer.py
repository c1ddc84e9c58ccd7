"""Each shard is a slice of the padded flat built at construction, not a copy: the shard's
storage is the whole padded flat (W x the shard), kept alive for the life of the wrapper
(axolotl-ai-cloud/axolotl PR #3597: sharded views kept the full construction buffer alive).
Values stay right; persistent memory is W times the shards'.
Caught by: test_only_shards_persist_between_steps."""
SELECT = 'test_only_shards_persist'
MESSAGE = 'more than the shards persist after construction'
MUTATE = [("nn.Parameter(flat[self.rank * c:(self.rank + 1) * c].clone(), requires_grad=(k == 0))",
           "nn.Parameter(flat[self.rank * c:(self.rank + 1) * c], requires_grad=(k == 0))")]
