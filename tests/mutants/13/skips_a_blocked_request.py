"""Admission skips a waiting request that does not fit and admits a later, smaller one: the big request can
starve (the contract's first-come-first-served admission blocks at the head of the line, as vLLM's does).
Caught by: test_admission_stops_at_the_first_request_that_does_not_fit[pool] ("skipped the blocked head")."""
SELECT = "test_admission_stops_at_the_first_request_that_does_not_fit and pool"
MESSAGE = "skipped the blocked head"
MUTATE = [("            while self.waiting and len(self.running) < self.max_num_seqs:\n"
           "                seq = self.waiting[0]\n",
           "            for seq in list(self.waiting):\n"
           "                if len(self.running) >= self.max_num_seqs:\n"
           "                    break\n"),
          ("                if new > budget or not bm.can_allocate(t):\n"
           "                    break                                # head-of-line blocking\n",
           "                if new > budget or not bm.can_allocate(t):\n"
           "                    continue                             # bug: skip to a later request\n"),
          ("                self.waiting.popleft()\n", "                self.waiting.remove(seq)\n")]
