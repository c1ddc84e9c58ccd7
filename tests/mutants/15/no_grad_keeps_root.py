"""Under torch.no_grad() the root stays gathered after forward returns (pytorch/pytorch #149029).
Caught by: test_no_grad_forward_frees_every_gathered_buffer."""
SELECT = 'test_no_grad_forward'
MESSAGE = 'gathered buffers kept after a no-grad forward'
MUTATE = [("        if not torch.is_grad_enabled() or not outs:\n            for i in range(root + 1):\n                self._free(i)\n",
           "        if not torch.is_grad_enabled() or not outs:\n            for i in range(root):\n                self._free(i)\n")]
