"""Admission runs even in a step that preempted: the victim, now first in line, or a newcomer grabs the blocks
just freed, and the next decode preempts again (vllm-project/vllm#25538; vLLM V1 admits nobody in such a step).
Caught by: test_preemption_by_recomputation ("admitted a request in a step that preempted")."""
SELECT = "test_preemption_by_recomputation"
MESSAGE = "admitted a request in a step that preempted"
MUTATE = [("        if not preempted:                                # 2. admission, only in a step that preempted nobody\n",
           "        if True:                                         # 2. admission (bug: also after a preemption)\n")]
