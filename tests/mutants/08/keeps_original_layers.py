"""ParallelMLP keeps the unsharded fc1 and fc2 (e.g. for a later re-shard): every rank holds the full weights too.
Caught by: test_parameters_hold_one_wth_in_storages_of_their_own[mlp-W2] ("no reference to the original layers")."""
SELECT = 'test_parameters_hold_one_wth_in_storages_of_their_own and mlp-W2'
MESSAGE = 'no reference to the original layers'
MUTATE = [("        return cls(ColumnParallelLinear.from_linear(fc1, group), RowParallelLinear.from_linear(fc2, group), activation)\n",
           "        m = cls(ColumnParallelLinear.from_linear(fc1, group), RowParallelLinear.from_linear(fc2, group), activation)\n"
           "        m.__dict__['_originals'] = (fc1, fc2)\n        return m\n")]
