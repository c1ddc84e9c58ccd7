"""The gathered buffer is never freed once the gradient is reduce-scattered, and the end of
backward frees nothing: every unit stays gathered between steps (refilled at each gather, so the
values stay right).
Caught by: test_only_shards_persist_between_steps."""
SELECT = 'test_only_shards_persist'
MESSAGE = 'full parameters kept after backward'
MUTATE = [("            if f is not None and not f.gathered:\n", "            if f is not None and f.work is None:  # refilled each time (unless a prefetch is in flight)\n"),
          ("                f.shard.grad.add_(out)\n            self._free(i)\n", "                f.shard.grad.add_(out)\n"),
          ("        for i in range(len(self._flats)):\n            self._free(i)\n\n    def _queue_end",
           "        pass\n\n    def _queue_end"),
          ("            self._free(i)  # reshard after forward\n", "            self.__dict__.setdefault('_kept', []).append([f.full.clone() for f in self._flats[i] if f is not None])\n            self._free(i)  # reshard after forward\n")]
