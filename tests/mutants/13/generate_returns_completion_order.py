"""``generate`` returns the outputs in the order the requests finished, not in prompt order (vllm-project/vllm#394:
``LLM.generate`` once returned outputs out of order).
Caught by: test_generate_returns_outputs_in_prompt_order ("in prompt order")."""
SELECT = "test_generate_returns_outputs_in_prompt_order"
MESSAGE = "in prompt order"
MUTATE = [("        while self.has_unfinished():\n            self.step()\n        return [list(self.sequences[i].output) for i in ids]\n",
           "        done = []\n        while self.has_unfinished():\n"
           "            done += [sid for sid, _ in self.step() if self.sequences[sid].status == 'finished']\n"
           "        return [list(self.sequences[i].output) for i in done]   # bug: completion order\n")]
