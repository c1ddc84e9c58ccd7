"""ParallelAttention views this rank's q, k and v, (B, L, d/W) each, with the global head count:
``.view(B, -1, n_heads, D)`` (a rank holds n_heads/W heads). Where W does not divide L the view
fails; where it does, it runs and silently folds the sequence into the heads (the attention of
L/W "tokens" of n_heads heads). A real bug class of tensor-parallel attention ports: the local
head count (Megatron's ``num_attention_heads_per_partition``) confused with the global one.
Caught by: test_parallel_attention_reshapes_into_this_ranks_heads[W2-L6] ("the heads were reshaped
with the global head count")."""
SELECT = "test_parallel_attention_reshapes_into_this_ranks_heads and W2"
MESSAGE = "the heads were reshaped with the global head count"
MUTATE = [
    ("        return cls(qkv.weight.detach()[rows].clone(), bias, RowParallelLinear.from_linear(proj, group), h, group,\n",
     "        return cls(qkv.weight.detach()[rows].clone(), bias, RowParallelLinear.from_linear(proj, group), n_heads,\n"
     "                   group,\n"),
    ("        q, k, v = (t.view(B, L, self.n_heads_local, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))\n",
     "        H, D = self.n_heads_local, x.shape[-1] // self.n_heads_local   # the global head count\n"
     "        q, k, v = (t.reshape(B, -1, H, D).transpose(1, 2) for t in qkv.chunk(3, dim=-1))\n"),
]
