"""Frozen parameters sharded into the trainable flat (no uniform-requires_grad rule,
pytorch/pytorch #104690): they receive gradients and SGD changes them.
Caught by: test_frozen_parameters_in_their_own_flat."""
SELECT = 'test_frozen_parameters'
MESSAGE = 'fsdp.parameters() yields'
MUTATE = [("                    per_unit[i][0 if p.requires_grad else 1].append(p)\n",
           "                    per_unit[i][0].append(p)\n")]
