"""Preemption picks the oldest running sequence (``running.pop(0)``) instead of the most recently admitted
one. vLLM preempts the lowest-priority request, the newest under FCFS (Kwon et al. 2023, section 4.5: "all
blocks of a sequence group are ... preempted together ... the latest arrived"): preempting the oldest throws away
the most computed work and can starve it.
Caught by: test_preemption_by_recomputation ("preempted the oldest instead of the newest")."""
SELECT = "test_preemption_by_recomputation"
MESSAGE = "preempted the oldest instead of the newest"
MUTATE = [("                victim = self.running.pop()              # the most recently admitted\n",
           "                victim = self.running.pop(0)             # the oldest (bug)\n"),
          ("            if seq.status != \"running\":                  # it preempted itself: the decode phase ends\n"
           "                break\n",
           "            if seq.status != \"running\":                  # it preempted itself: the decode phase ends\n"
           "                break\n"
           "            if seq not in self.running:\n"
           "                continue\n")]
