"""checkpoint calls torch.utils.checkpoint.checkpoint (reentrant) instead of its own Function: torch does the
recomputation the lab asks you to build.
Caught by: test_checkpoint_does_not_use_torch_utils_checkpoint ("the contract forbids torch.utils.checkpoint": the submission imports it)."""
SELECT = 'test_checkpoint_does_not_use_torch_utils_checkpoint'
MESSAGE = 'the contract forbids torch.utils.checkpoint'
MUTATE = [("    anchor = torch.empty(0, requires_grad=True)\n    return _Checkpoint.apply(fn, anchor, *args)\n",
           "    import torch.utils.checkpoint as tuc\n    return tuc.checkpoint(fn, *args, use_reentrant=True)\n")]
