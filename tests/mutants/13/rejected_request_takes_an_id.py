"""``add_request`` takes the next id before the scheduler has accepted the request: a request the scheduler refuses
(it could need more tokens than max_num_batched_tokens, or more blocks than the pool) burns an id, and ids are no
longer 0, 1, 2, ... over the accepted requests.
Caught by: test_add_request_refuses_bad_requests_and_they_take_no_id ("a rejected request takes no id")."""
SELECT = "test_add_request_refuses_bad_requests_and_they_take_no_id"
MESSAGE = "a rejected request takes no id"
MUTATE = [("        K = len(prompt) + max_new_tokens - 1\n        if K > self.scheduler.max_num_batched_tokens:\n",
           "        K = len(prompt) + max_new_tokens - 1\n        if False:\n"),
          ("        if -(-K // self.block_manager.block_size) > self.block_manager.num_blocks:\n",
           "        if False:\n"),
          ("        seq = Sequence(self._next_id, list(prompt), max_new_tokens, eos_token_id)\n        self.scheduler.add(seq)\n"
           "        self.sequences[seq.seq_id] = seq\n        self._next_id += 1\n",
           "        seq = Sequence(self._next_id, list(prompt), max_new_tokens, eos_token_id)\n        self._next_id += 1   # bug\n"
           "        self.scheduler.add(seq)\n        self.sequences[seq.seq_id] = seq\n")]
