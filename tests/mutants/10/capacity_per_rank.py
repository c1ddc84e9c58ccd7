"""Expert parallelism applies capacity per rank: capacity(T_r, E, k, cf) over this rank's tokens alone, positions
restarting at each rank, instead of capacity(sum_r T_r, ...) in the union's token order.
Caught by: test_expert_parallel_capacity_follows_the_union ("capacity computed per rank")."""
SELECT = 'test_expert_parallel_capacity_follows_the_union'
MESSAGE = 'capacity computed per rank'
MUTATE = [("            keep = keep & (before + _positions(hot) < capacity(T_all, E, k, self.capacity_factor))\n",
           "            keep = keep & (_positions(hot) < capacity(T_r, E, k, self.capacity_factor))\n")]
