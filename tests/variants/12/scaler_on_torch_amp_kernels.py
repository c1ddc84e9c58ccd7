"""A DynamicLossScaler with GradScaler's own internal layout: the scale and the growth tracker are 0-dim tensors
(float32, int32) updated in place by torch's AMP kernels (torch._amp_foreach_non_finite_check_and_unscale_ multiplies
every gradient by the float32 reciprocal of the scale and flags inf/NaN into a tensor; torch._amp_update_scale_ backs
off or grows and restarts the tracker), one stage variable instead of three flags, scale(loss) multiplies by the
scale tensor, scale_value is a property reading it.
Proves: the scaler and train_step graders accept any correct scaler, whatever holds its state."""
MAY_FAIL = []
SELECT = "scaler or train_step"
MUTATE = [
    ("        self.scale_value = float(init_scale)\n        self.growth_factor = float(growth_factor)\n"
     "        self.backoff_factor = float(backoff_factor)\n        self.growth_interval = int(growth_interval)\n"
     "        self._clean_steps = 0      # clean steps in a row since the last change of scale\n"
     "        self._unscaled = False     # unscale_ was called this iteration\n"
     "        self._found_inf = False    # ... and found an inf/NaN gradient\n"
     "        self._skipped = False      # the last step() skipped the optimizer\n",
     "        self._scale = torch.full((), float(init_scale), dtype=torch.float32)\n"
     "        self._growth_tracker = torch.zeros((), dtype=torch.int32)  # clean steps since the last change\n"
     "        self._found_inf = torch.zeros((), dtype=torch.float32)     # 1.0 once an inf/NaN gradient is seen\n"
     "        self._factors = (float(growth_factor), float(backoff_factor), int(growth_interval))\n"
     "        self._stage = \"ready\"  # ready -> unscaled -> stepped -> (update) ready\n\n"
     "    @property\n    def scale_value(self) -> float:\n        return float(self._scale)\n"),
    ("        return loss * self.scale_value\n", "        return loss * self._scale.to(loss.device)\n"),
    ("        if self._unscaled:\n", "        if self._stage != \"ready\":\n"),
    ("        found = False\n        for group in optimizer.param_groups:\n            for p in group[\"params\"]:\n"
     "                if p.grad is not None:\n                    p.grad.div_(self.scale_value)\n"
     "                    found = found or not bool(torch.isfinite(p.grad).all())\n"
     "        self._unscaled, self._found_inf = True, found\n",
     "        grads = [p.grad for group in optimizer.param_groups for p in group[\"params\"] if p.grad is not None]\n"
     "        if grads:\n            inv = self._scale.double().reciprocal().float()\n"
     "            torch._amp_foreach_non_finite_check_and_unscale_(grads, self._found_inf, inv)\n"
     "        self._stage = \"unscaled\"\n"),
    ("        if not self._unscaled:\n            self.unscale_(optimizer)\n        self._skipped = self._found_inf\n"
     "        if self._skipped:\n            return False\n",
     "        if self._stage == \"ready\":\n            self.unscale_(optimizer)\n        self._stage = \"stepped\"\n"
     "        if bool(self._found_inf):\n            return False\n"),
    ("        if self._skipped:\n            self.scale_value *= self.backoff_factor\n"
     "            self._clean_steps = 0\n"
     "        else:\n            self._clean_steps += 1\n            if self._clean_steps == self.growth_interval:\n"
     "                self.scale_value *= self.growth_factor\n                self._clean_steps = 0\n"
     "        self._unscaled = self._found_inf = self._skipped = False\n",
     "        growth, backoff, interval = self._factors\n"
     "        torch._amp_update_scale_(self._scale, self._growth_tracker, self._found_inf, growth, backoff, interval)\n"
     "        self._found_inf.zero_()\n        self._stage = \"ready\"\n"),
]
