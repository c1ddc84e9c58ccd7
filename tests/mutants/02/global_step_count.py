"""Bias correction uses one optimizer-wide step count instead of a count per parameter,
so a parameter whose first gradient arrives late is corrected with a too-large t.
Caught by: test_bias_correction_counts_steps_per_parameter[W2-first-grad-in-step-3] (selected), and
test_first_update_of_a_late_parameter_is_adams_first_step."""
SELECT = 'test_bias_correction_counts_steps_per_parameter and W2-first-grad-in-step-3'
MESSAGE = 'bias correction step counted per optimizer or per group, not per parameter'
MUTATE = [
    ("""        # 3. AdamW on the owned elements""", """        self._t = getattr(self, "_t", 0) + 1
        # 3. AdamW on the owned elements"""),
    ("""            state["step"] += 1
            t = state["step"]""", """            state["step"] = self._t
            t = state["step"]"""),
]
