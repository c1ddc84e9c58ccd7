"""The layers get views of a copy of the gathered buffer (``full.detach().clone()``, the leaf
autograd differentiates), not of the buffer itself: resharding frees the buffer, but autograd's
saved views keep the copy alive until the unit's backward (the contract's "dropping the
reference is not enough" pitfall; FSDP2's copy-out holds a unit twice). Values stay right.
Caught by: test_full_parameters_resident_one_unit_at_a_time (the tagging probe: a copy of
gathered storage is full-parameter storage)."""
SELECT = 'test_full_parameters_resident'
MESSAGE = 'gathered copy kept alive'
MUTATE = [("            base = self.leaf = self.full.detach().requires_grad_(True)\n",
           "            base = self.leaf = self.full.detach().clone().requires_grad_(True)\n")]
