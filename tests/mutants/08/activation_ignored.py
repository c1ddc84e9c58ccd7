"""ParallelMLP applies GELU whatever activation from_mlp was given (the default hard-coded
in forward). Caught by: test_parallel_mlp_applies_the_activation_it_is_given ("the
activation argument of from_mlp is ignored (GELU hard-coded)")."""
SELECT = "test_parallel_mlp_applies_the_activation_it_is_given"
MESSAGE = 'the activation argument of from_mlp is ignored'
MUTATE = [("        return self.fc2(self.activation(self.fc1(x)))\n",
           "        return self.fc2(F.gelu(self.fc1(x)))\n")]
