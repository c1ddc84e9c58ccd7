"""Bias correction uses one optimizer-wide step count (as tests/mutants/02/global_step_count.py),
no other bug. Issue 13 point 7: graded in one place, the step-count tests (the AdamW replay of
test_bias_correction_counts_steps_per_parameter, and test_first_update_of_a_late_parameter_is_adams_first_step,
which reads a late parameter's first update against Adam's closed form instead); the grad-None
test uses inputs where the count cannot matter. Every failing test names the bug class."""
BUG = True
MESSAGE = "bias correction step counted per optimizer or per group, not per parameter"
MAY_FAIL = ["test_bias_correction_counts_steps_per_parameter",
            "test_first_update_of_a_late_parameter_is_adams_first_step"]
SELECT = "W2 and (grad_none_on_all_ranks or bias_correction) or first_update"
MUTATE = [
    ("""        # 3. AdamW on the owned elements""", """        self._t = getattr(self, "_t", 0) + 1
        # 3. AdamW on the owned elements"""),
    ("""            state["step"] += 1
            t = state["step"]""", """            state["step"] = self._t
            t = state["step"]"""),
]
