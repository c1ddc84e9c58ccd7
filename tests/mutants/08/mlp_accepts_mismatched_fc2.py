"""from_mlp never checks fc2.in_features against fc1.out_features: where W divides both, the
layers shard without complaint and the mismatch surfaces only in forward (a shape error), or
never if a caller only builds the module. The contract raises ValueError naming
fc2.in_features at construction.
Caught by: test_from_mlp_refuses_sizes_that_do_not_fit[fc2.in_features=9-not-fc1.out_features=6]
("nothing was raised; the contract's error for a size that does not fit is ValueError")."""
SELECT = "test_from_mlp_refuses_sizes_that_do_not_fit and fc2"
MESSAGE = "nothing was raised; the contract's error for a size that does not fit is ValueError"
MUTATE = [("        if fc2.in_features != fc1.out_features:\n"
           "            raise ValueError(f\"fc2.in_features={fc2.in_features} must equal fc1.out_features={fc1.out_features}\")\n",
           "")]
