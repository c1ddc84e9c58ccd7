"""Greedy picks the last maximal logit (a reversed argmax) instead of the lowest token id: exact ties, which
duplicated rows of a head or a quantized model produce, go to the other token (``torch.argmax`` returns the first).
Caught by: test_argmax_ties_go_to_the_lowest_token_id ("ties must go to the lowest token id")."""
SELECT = "test_argmax_ties_go_to_the_lowest_token_id"
MESSAGE = "ties must go to the lowest token id"
MUTATE = [("        tokens = logits.argmax(dim=-1).tolist()                     # ties: the lowest token id\n",
           "        tokens = (logits.shape[-1] - 1 - logits.flip(-1).argmax(dim=-1)).tolist()   # bug: the highest\n")]
