"""The union's probability sums come from torch.distributed.nn's all_reduce, whose backward sums the gradients over
the ranks: every rank's router share counts the aux loss W times.
Caught by: test_expert_parallel_aux_loss_is_the_unions[W2] ("counts the aux loss W=2 times")."""
SELECT = 'test_expert_parallel_aux_loss_is_the_unions and W2'
MESSAGE = 'counts the aux loss W=2 times'
MUTATE = [("        aux = E * (f * (probs.sum(0) + others) / T_all).sum()           # this rank's tokens carry the gradient\n",
           "        import torch.distributed.nn.functional as dnf\n"
           "        total = dnf.all_reduce(probs.sum(0), group=group) if W > 1 else probs.sum(0)\n"
           "        aux = E * (f * total / T_all).sum()\n")]
