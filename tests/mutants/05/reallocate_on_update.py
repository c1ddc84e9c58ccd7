"""Bug: update writes into fresh copies of the storage (clone, then write) instead of
into the preallocated buffers, so the storage is reallocated at every step.

Killed by: test_storage_never_reallocated_during_generation,
test_update_returns_views_of_the_stored_prefix.
"""
SELECT = 'test_update_returns_views_of_the_stored_prefix'
MESSAGE = 'or the storage was reallocated'
MUTATE = [
    ("        self.k[layer_idx, :, :, S:S + T] = k\n",
     "        self.k, self.v = self.k.clone(), self.v.clone()  # out-of-place, to be safe\n"
     "        self.k[layer_idx, :, :, S:S + T] = k\n"),
]
