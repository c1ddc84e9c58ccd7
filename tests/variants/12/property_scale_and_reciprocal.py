"""A DynamicLossScaler written another way: scale_value is a read-only property over a private float, unscale_
multiplies by the reciprocal (exact for the power-of-two scales graded) and finds inf/NaN with one torch.isfinite
over all gradients at once; checkpoint passes its empty anchor tensor only when no argument requires grad.
Proves: the scaler and checkpoint graders accept any correct code, property or attribute, division or reciprocal."""
MAY_FAIL = []
SELECT = "scaler or train_step or test_checkpoint_gradients"
MUTATE = [("        self.scale_value = float(init_scale)\n", "        self._scale = float(init_scale)\n"),
          ("    def scale(self, loss: torch.Tensor) -> torch.Tensor:\n",
           "    @property\n    def scale_value(self) -> float:\n        return self._scale\n\n"
           "    def scale(self, loss: torch.Tensor) -> torch.Tensor:\n"),
          ("        found = False\n        for group in optimizer.param_groups:\n            for p in group[\"params\"]:\n"
           "                if p.grad is not None:\n                    p.grad.div_(self.scale_value)\n"
           "                    found = found or not bool(torch.isfinite(p.grad).all())\n",
           "        grads = [p.grad for group in optimizer.param_groups for p in group[\"params\"] if p.grad is not None]\n"
           "        inv = 1.0 / self._scale\n        for g in grads:\n            g.mul_(inv)\n"
           "        found = bool(grads) and not bool(torch.isfinite(torch.cat([g.reshape(-1) for g in grads])).all())\n"),
          ("            self.scale_value *= self.backoff_factor\n", "            self._scale *= self.backoff_factor\n"),
          ("                self.scale_value *= self.growth_factor\n", "                self._scale *= self.growth_factor\n"),
          ("    anchor = torch.empty(0, requires_grad=True)\n    return _Checkpoint.apply(fn, anchor, *args)\n",
           "    needed = not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)\n"
           "    anchor = torch.empty(0, requires_grad=needed)\n    return _Checkpoint.apply(fn, anchor, *args)\n")]
