"""The prefix-cache key of a block hashes only its own B tokens, not the tokens before it: the same B tokens at
another position, or after another prefix, hit a block whose K/V was computed in another context (vLLM chains the
hash: ``hash_block_tokens(parent_block_hash, block_tokens)``; RadixAttention matches whole prefixes).
Caught by: test_a_prefix_key_covers_every_earlier_token ("chain the prefix cache keys")."""
SELECT = "test_a_prefix_key_covers_every_earlier_token"
MESSAGE = "chain the prefix cache keys"
MUTATE = [("            key = hash((key, tuple(token_ids[i * B:(i + 1) * B])))\n",
           "            key = hash(tuple(token_ids[i * B:(i + 1) * B]))  # bug: not chained\n")]
