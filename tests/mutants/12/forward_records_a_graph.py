"""The Function's forward runs fn under torch.enable_grad(): fn records a graph and autograd keeps all its
activations during forward, so checkpointing saves nothing.
Caught by: test_checkpoint_forward_keeps_only_the_tensor_arguments ("fn ran with grad enabled during forward")."""
SELECT = 'test_checkpoint_forward_keeps_only_the_tensor_arguments and input-requires-grad'
MESSAGE = 'fn ran with grad enabled during forward'
MUTATE = [("        with torch.no_grad():\n            return fn(*args)\n",
           "        with torch.enable_grad():\n            return fn(*args).detach()\n")]
