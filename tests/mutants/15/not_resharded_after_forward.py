"""No reshard after forward: a unit's gathered buffer is kept from its forward until its
gradient is reduce-scattered in backward (ZeRO-3 without the free after forward, i.e. FSDP's
``reshard_after_forward=False`` / ZeRO-2 memory), so every unit is gathered at once by the end of
forward. Values stay right; the contract's one-unit bound is exceeded in forward.
Caught by: test_full_parameters_resident_one_unit_at_a_time (the tagging probe)."""
SELECT = 'test_full_parameters_resident'
MESSAGE = 'unit kept gathered after its forward'
MUTATE = [("            self._free(i)  # reshard after forward\n", "            pass  # kept gathered until its backward\n")]
