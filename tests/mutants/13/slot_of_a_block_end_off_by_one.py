"""The block of position p is computed as ``(p + 1) // B`` (the count of positions up to p, not p's index):
the slot of a full block's last position lands in the next block of the table.
Caught by: test_model_inputs_are_the_contracts_six_tensors[decode-B4] ("the slot of a full block's last position is
off by one")."""
SELECT = "test_model_inputs_are_the_contracts_six_tensors"
MESSAGE = "the slot of a full block's last position is off by one"
MUTATE = [("        for p in range(c, c + n):\n            pos.append(p)\n            slots.append(table[p // B] * B + p % B)\n"
           "        qsl.append(qsl[-1] + n)",
           "        for p in range(c, c + n):\n            pos.append(p)\n"
           "            slots.append(table[min((p + 1) // B, len(table) - 1)] * B + p % B)   # bug\n"
           "        qsl.append(qsl[-1] + n)")]
