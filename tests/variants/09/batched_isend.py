"""Correct, written another way: activations and input gradients leave through
``dist.batch_isend_irecv`` (one ``P2POp(dist.isend, ...)`` per message) rather than
``dist.isend``. The contract allows it among the point-to-point calls: it must lose no point."""
MAY_FAIL = []
SELECT = "loss_and_gradients or point_to_point or deadlock or holds or executes"
MUTATE = [
    ("                pending.append((dist.isend(out, peer(stage + 1), group=group), out))\n",
     "                pending.append((dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer(stage + 1), group)])[0],\n"
     "                                out))\n"),
    ("                pending.append((dist.isend(gx, peer(stage - 1), group=group), gx))\n",
     "                pending.append((dist.batch_isend_irecv([dist.P2POp(dist.isend, gx, peer(stage - 1), group)])[0],\n"
     "                                gx))\n"),
]
