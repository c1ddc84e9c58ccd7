"""Bug: nbytes counts elements, not bytes (the itemsize forgotten).

Caught by: test_nbytes_equals_formula_and_storage_is_preallocated ("nbytes is wrong ...
elements, not bytes").
"""
SELECT = "test_nbytes_equals_formula_and_storage_is_preallocated and B1 and fp32"
MESSAGE = 'elements, not bytes'
MUTATE = [("        return self.latent.numel() * self.latent.element_size()\n",
           "        return self.latent.numel()\n")]
