"""Correct, written another way: the attention block keeps this rank's query, key and value
weights (and biases) as three parameters, not one fused qkv shard, and runs three linears on
the input. The contract fixes the rows a rank holds, not how it stores them: the graders find
shards by value, so it must lose no point (including the 1/W memory and the one all-reduce
each way)."""
MAY_FAIL = []
SELECT = "attention or one_all_reduce or memory or non_contiguous"
MUTATE = [
    ("        self.qkv_weight = nn.Parameter(qkv_weight)\n"
     "        self.qkv_bias = nn.Parameter(qkv_bias) if qkv_bias is not None else None\n",
     "        self.q_weight, self.k_weight, self.v_weight = (nn.Parameter(w.clone()) for w in qkv_weight.chunk(3))\n"
     "        biases = qkv_bias.chunk(3) if qkv_bias is not None else (None,) * 3\n"
     "        self.q_bias, self.k_bias, self.v_bias = (None if b is None else nn.Parameter(b.clone()) for b in biases)\n"),
    ("        qkv = F.linear(copy_to_tp(x, self.group), self.qkv_weight, self.qkv_bias)\n"
     "        q, k, v = (t.view(B, L, self.n_heads_local, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))\n",
     "        x = copy_to_tp(x, self.group)\n"
     "        q, k, v = (F.linear(x, w, b).view(B, L, self.n_heads_local, -1).transpose(1, 2)\n"
     "                   for w, b in ((self.q_weight, self.q_bias), (self.k_weight, self.k_bias),\n"
     "                                (self.v_weight, self.v_bias)))\n"),
]
