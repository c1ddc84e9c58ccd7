"""The Function keeps its output as a ctx attribute (ctx.out): the output (and its storage) stays referenced by the
graph, beside the saved inputs, which defeats the memory saving (and makes a reference cycle).
Caught by: test_checkpoint_forward_keeps_only_the_tensor_arguments ("ctx keeping the output or intermediates")."""
SELECT = 'test_checkpoint_forward_keeps_only_the_tensor_arguments and input-requires-grad'
MESSAGE = 'ctx keeping the output or intermediates'
MUTATE = [("        with torch.no_grad():\n            return fn(*args)\n",
           "        with torch.no_grad():\n            out = fn(*args)\n        ctx.out = out\n        return out\n")]
