"""Blocking dist.send for activations and gradients: gloo's send waits for its recv, so 1F1B deadlocks for p >= 2, M >= 2.
Caught by: test_loss_and_gradients_equal_one_process[1f1b-p2-M4] (the watchdog's "deadlock")."""
MESSAGE = 'deadlock'
SELECT = 'test_loss_and_gradients_equal_one_process and 1f1b-p2-M4'
MUTATE = [("                pending.append((dist.isend(out, peer(stage + 1), group=group), out))\n",
           "                dist.send(out, peer(stage + 1), group=group)\n"),
          ("                pending.append((dist.isend(gx, peer(stage - 1), group=group), gx))\n",
           "                dist.send(gx, peer(stage - 1), group=group)\n")]
