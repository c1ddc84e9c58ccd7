"""Bias correction uses one optimizer-wide step count (as tests/mutants/02/global_step_count.py),
no other bug. Issue 13 point 7: graded in one place, the step-count test; the grad-None test
uses inputs where the count cannot matter."""
BUG = True
MAY_FAIL = ["test_bias_correction_counts_steps_per_parameter"]
SELECT = "W2 and (grad_none_on_all_ranks or bias_correction)"
MUTATE = [
    ("""        # 3. AdamW on the owned elements""", """        self._t = getattr(self, "_t", 0) + 1
        # 3. AdamW on the owned elements"""),
    ("""            state["step"] += 1
            t = state["step"]""", """            state["step"] = self._t
            t = state["step"]"""),
]
