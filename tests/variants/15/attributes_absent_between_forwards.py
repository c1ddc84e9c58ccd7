"""Correct, written another way: between forwards the wrapped module's attributes of the removed
parameters are absent (the contract's other option), not views into a freed buffer: every
free deletes them, and each gather sets fresh views before the unit computes. It must lose no
point."""
MAY_FAIL = []
SELECT = "matches_single_process or padding or frozen or two_backwards or optimizer or group or step_sends or reduce_scattered or only_shards or no_grad or full_parameters_resident or prefetch"
MUTATE = [("        if self.gathered:\n            self.full.untyped_storage().resize_(0)\n",
           "        if self.gathered:\n            self.full.untyped_storage().resize_(0)\n"
           "        for _, _, regs in self.entries:\n            for m, name in regs:\n"
           "                m.__dict__.pop(name, None)\n")]
