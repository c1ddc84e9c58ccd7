"""Bug: a stale folded weight: the absorbed path copies wkv_b (in the layout it folds) on
its first call and reuses the copy forever, so after wkv_b changes (load_state_dict, a
training step) absorbed outputs follow the old weights.

Caught by: test_absorbed_outputs_follow_changes_of_wkv_b ("a stale folded weight").
"""
SELECT = "test_absorbed_outputs_follow_changes_of_wkv_b"
MESSAGE = 'a stale folded weight'
MUTATE = [
    ("            w = self.wkv_b.weight.to(wide).view(H, dn + dv, r)   # recomputed each call: never stale\n",
     "            if getattr(self, \"_fold\", None) is None:   # folded once, on the first call\n"
     "                self._fold = self.wkv_b.weight.to(wide).view(H, dn + dv, r).clone()\n"
     "            w = self._fold\n"),
]
