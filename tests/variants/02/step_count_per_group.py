"""Bias correction uses one step count per param group, advanced in every step in which some
parameter of the group has a gradient on some rank: right for a group whose parameters all start
together, wrong for a parameter whose first gradient comes after its group's other parameters'.
No other bug. Issue "fair, sharp graders": the step-count pitfall (per optimizer or per group) is
caught by two independent tests, the AdamW replay of test_bias_correction_counts_steps_per_parameter
and the closed-form first update of test_first_update_of_a_late_parameter_is_adams_first_step
(its group 1 starts late as a whole, where a per-group count is right: only group 0's late
parameter fails it); both name the bug class. The per-group and grad-None tests pass."""
BUG = True
MESSAGE = "bias correction step counted per optimizer or per group, not per parameter"
MAY_FAIL = ["test_bias_correction_counts_steps_per_parameter",
            "test_first_update_of_a_late_parameter_is_adams_first_step"]
SELECT = "W2 and (grad_none_on_all_ranks or bias_correction or param_groups) or first_update"
MUTATE = [
    ("""        # 3. AdamW on the owned elements""", """        self._gt = getattr(self, "_gt", [0] * len(self.param_groups))
        for gi in sorted({gi for i, (_, gi, _) in enumerate(self._layout) if has_grad[i]}):
            self._gt[gi] += 1  # one count per group
        # 3. AdamW on the owned elements"""),
    ("""            state["step"] += 1
            t = state["step"]""", """            state["step"] = self._gt[gi]
            t = state["step"]"""),
]
