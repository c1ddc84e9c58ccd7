"""Backward with retain_graph=True and the outputs kept to the end of the call: every microbatch's saved activations
stay alive (M held at once under 1F1B, not p - s; released only when the call returns).
Caught by: test_1f1b_frees_each_microbatch_with_its_backward[p4-M8] (more held than the order run needs: "kept after
its backward")."""
MESSAGE = 'kept after its backward'
SELECT = 'test_1f1b_frees_each_microbatch_with_its_backward and p4-M8'
MUTATE = [("            y = outputs.pop(m)\n", "            y = outputs[m]\n"),
          ("                y.backward(g)\n", "                y.backward(g, retain_graph=True)\n")]
