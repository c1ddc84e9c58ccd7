"""Hits are capped at ``n // B`` blocks instead of ``(n - 1) // B``: a fully cached prompt has nothing left to
compute and no logits for its next token (vLLM V1 computes at least the last token: ``max_cache_hit_length =
request.num_tokens - 1``; nano-vllm#144).
Caught by: test_hits_leave_the_last_token_to_compute ("at least the last token")."""
SELECT = "test_hits_leave_the_last_token_to_compute"
MESSAGE = "at least the last token"
MUTATE = [("        for key in self._keys(token_ids, (len(token_ids) - 1) // self.block_size):\n",
           "        for key in self._keys(token_ids, len(token_ids) // self.block_size):\n")]
