"""A preempted request goes to the back of ``waiting`` (``append``) instead of the front (``appendleft``): it
waits behind every newer request although it is the oldest unfinished one (vLLM's scheduler puts preempted
requests back first in line: ``self.waiting.prepend_request``).
Caught by: test_preemption_by_recomputation ("put at the back of waiting instead of the front")."""
SELECT = "test_preemption_by_recomputation"
MESSAGE = "put at the back of waiting instead of the front"
MUTATE = [("        self.waiting.appendleft(seq)\n", "        self.waiting.append(seq)\n")]
