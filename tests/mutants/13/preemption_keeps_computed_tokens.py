"""Preemption frees the blocks but leaves ``num_computed_tokens`` as it was, so the waiting request claims K/V
it no longer has (readmission then overwrites it with the cached prefix only by luck).
Caught by: test_preemption_by_recomputation ("kept its num_computed_tokens")."""
SELECT = "test_preemption_by_recomputation"
MESSAGE = "kept its num_computed_tokens"
MUTATE = [("        seq.num_computed_tokens = 0\n        seq.num_scheduled_tokens = 0\n        self.waiting.appendleft(seq)\n",
           "        seq.num_scheduled_tokens = 0\n        self.waiting.appendleft(seq)\n")]
