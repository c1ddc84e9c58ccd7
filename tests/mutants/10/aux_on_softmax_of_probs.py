"""MoE hands load_balancing_loss the softmax of the router probabilities instead of the probabilities: the aux loss
on softmax(softmax(logits)) (the bug of passing probabilities to a function that takes logits, like Hugging Face's
load_balancing_loss_func, which applies its own softmax).
Caught by: test_moe_aux_loss_is_the_routed_load_balancing_loss ("computed on softmax(softmax(logits))")."""
SELECT = 'test_moe_aux_loss_is_the_routed_load_balancing_loss'
MESSAGE = 'the aux loss is computed on softmax(softmax(logits))'
MUTATE = [("        aux = load_balancing_loss(torch.softmax(logits.float(), dim=-1), idx, E)\n",
           "        aux = load_balancing_loss(torch.softmax(torch.softmax(logits.float(), dim=-1), dim=-1), idx, E)\n")]
