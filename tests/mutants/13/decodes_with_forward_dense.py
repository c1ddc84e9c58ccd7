"""The engine fills the pool with ``model(inputs, kv_cache)`` but takes each token from ``model.forward_dense``
over the whole sequence (the oracle's way, what ``reference_generate`` does): right tokens at the cost of a full
recomputation per token, which the contract forbids.
Caught by: test_steps_follow_the_schedule_and_fill_the_pool ("called model.forward_dense")."""
SELECT = "test_steps_follow_the_schedule_and_fill_the_pool and B1"
MESSAGE = "called model.forward_dense"
MUTATE = [("        tokens = logits.argmax(dim=-1).tolist()                     # ties: the lowest token id\n",
           "        tokens = [int(self.model.forward_dense(torch.tensor(s.token_ids))[-1].argmax()) for s in batch]  # bug\n")]
