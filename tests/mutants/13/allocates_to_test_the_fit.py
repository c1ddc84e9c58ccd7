"""Admission allocates a request's blocks first and frees them again when its tokens do not fit the budget: the
pool's answer is right, but the free queue is reordered (freed blocks go to the tail), so later block ids, and
through eviction later prefix hits, differ from the contract's ("allocate only a request you admit").
Caught by: test_admission_stops_at_the_first_request_that_does_not_fit[budget] ("changed the pool other than by
the contract's calls")."""
SELECT = "test_admission_stops_at_the_first_request_that_does_not_fit and budget and not cached"
MESSAGE = "changed the pool other than by the contract's calls"
MUTATE = [("                if new > budget or not bm.can_allocate(t):\n"
           "                    break                                # head-of-line blocking\n"
           "                cached = bm.allocate(seq.seq_id, t)\n",
           "                if not bm.can_allocate(t):\n"
           "                    break\n"
           "                cached = bm.allocate(seq.seq_id, t)\n"
           "                if new > budget:\n"
           "                    bm.free(seq.seq_id)                  # bug: allocated to test the fit\n"
           "                    break\n")]
