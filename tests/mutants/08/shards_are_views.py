"""Shards kept as views of the full weights (no .clone()): each rank's parameters hold the whole storage.
Caught by: test_parameters_hold_one_wth_in_storages_of_their_own[mlp-W2] ("bytes of tensor storage are reachable")."""
SELECT = 'test_parameters_hold_one_wth_in_storages_of_their_own and mlp-W2'
MESSAGE = 'keep copies of the shards (.clone(), not views of the full weight)'
MUTATE = [("        return cls(linear.weight.detach()[rows].clone(), bias, group, gather_output)\n",
           "        return cls(linear.weight.detach()[rows], bias, group, gather_output)\n"),
          ("        return cls(linear.weight.detach()[:, r * n:(r + 1) * n].clone(), bias, group, input_is_parallel)\n",
           "        return cls(linear.weight.detach()[:, r * n:(r + 1) * n], bias, group, input_is_parallel)\n")]
