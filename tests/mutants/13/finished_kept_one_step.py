"""A finished request leaves ``running`` at once but its blocks are freed only at the start of the next
``schedule()``: for one step the pool holds blocks nobody uses (Orca: a finished request leaves the batch, and
its memory, at once).
Caught by: test_finished_requests_leave_at_once ("kept its blocks one step")."""
SELECT = "test_finished_requests_leave_at_once"
MESSAGE = "kept its blocks one step"
MUTATE = [("        bm = self.block_manager\n        batch: list[Sequence] = []\n",
           "        bm = self.block_manager\n        for done in getattr(self, '_done', []):\n"
           "            bm.free(done.seq_id)\n        self._done = []\n        batch: list[Sequence] = []\n"),
          ("                self.block_manager.free(seq.seq_id)\n                self.running.remove(seq)\n",
           "                self.__dict__.setdefault('_done', []).append(seq)   # bug: freed next step\n"
           "                self.running.remove(seq)\n")]
