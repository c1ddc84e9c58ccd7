"""Backward with retain_graph=True and the outputs kept to the end of the call: every microbatch's saved activations
stay alive (M held at once under 1F1B, not p - s; released only when the call returns).
Caught by: test_1f1b_stage_s_holds_at_most_p_minus_s_microbatches[p4-M8] ("1F1B allows p - s")."""
SELECT = 'test_1f1b_stage_s_holds_at_most_p_minus_s_microbatches and p4-M8'
MUTATE = [("            y = outputs.pop(m)\n", "            y = outputs[m]\n"),
          ("                y.backward(g)\n", "                y.backward(g, retain_graph=True)\n")]
