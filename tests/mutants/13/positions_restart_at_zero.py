"""A multi-token computation (a prefill) numbers its tokens from position 0 whatever ``num_computed_tokens`` is:
after a cached prefix, or when a preempted request recomputes after its cached blocks, the new tokens get the
positions of the prefix (RoPE rotates them wrongly) - positions restart at 0 after recompute.
Caught by: test_model_inputs_are_the_contracts_six_tensors[prefix-B4] ("positions restart at 0")."""
SELECT = "test_model_inputs_are_the_contracts_six_tensors"
MESSAGE = "positions restart at 0"
MUTATE = [("        for p in range(c, c + n):\n            pos.append(p)\n            slots.append(table[p // B] * B + p % B)\n"
           "        qsl.append(qsl[-1] + n)\n        ctx.append(c + n)\n    W = max(len(t) for t in block_tables)",
           "        for p in range(c, c + n):\n            pos.append(p if n == 1 else p - c)   # bug: a prefill from 0\n"
           "            slots.append(table[p // B] * B + p % B)\n"
           "        qsl.append(qsl[-1] + n)\n        ctx.append(c + n)\n    W = max(len(t) for t in block_tables)")]
