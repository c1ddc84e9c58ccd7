"""One-change probe (issue "Graders that charge one deviation once", lab 09): a collective in
``run_pipeline``, an ``all_reduce`` (MAX) of the stage count after the argument checks, to make
sure every rank agrees (the pipeline itself is the reference's). The contract forbids
collectives; only the point-to-point test grades that, the other tests let it run."""
BUG = True
MAY_FAIL = ["test_only_point_to_point_messages_each_received_in_the_call"]
MESSAGE = "point-to-point send/recv only"
SELECT = "point_to_point or loss_and_gradients and p2-M4 or executes or group or wrong_stage or frees and p2-M5"
MUTATE = [("    first, last = stage == 0, stage == num_stages - 1\n",
           "    agreed = torch.tensor([num_stages])\n"
           "    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)\n"
           "    first, last = stage == 0, stage == num_stages - 1\n")]
