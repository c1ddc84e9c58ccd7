"""The sequence that finds no free block preempts itself, the oldest not yet decoded in this step, instead of the
most recently admitted one: the longest-running requests are thrown back and recomputed while newcomers keep their
blocks (vLLM preempts the lowest-priority request, the newest under FCFS: ``self.running.pop()``; Kwon et al. 2023,
section 4.5).
Caught by: test_preemption_by_recomputation ("preempted the oldest instead of the newest")."""
SELECT = "test_preemption_by_recomputation"
MESSAGE = "preempted the oldest instead of the newest"
MUTATE = [("                victim = self.running.pop()              # the most recently admitted\n",
           "                victim = self.running.pop(i)             # bug: the oldest not yet decoded (itself)\n")]
