"""An idle step still runs a forward (a warm-up on one dummy token) before returning ``[]``: wasted work on an
idle server, and it writes slot 0 of the pool (the contract: an empty batch returns [] and calls nothing).
Caught by: test_an_idle_step_calls_no_model ("an idle step called the model")."""
SELECT = "test_an_idle_step_calls_no_model"
MESSAGE = "an idle step called the model"
MUTATE = [("        batch = self.scheduler.schedule()\n        if not batch:\n            return []\n",
           "        batch = self.scheduler.schedule()\n        if not batch:\n"
           "            z = torch.zeros(1, dtype=torch.int64)\n"
           "            self.model(ModelInputs(z, z, z, torch.tensor([0, 1]), torch.ones(1, dtype=torch.int64),"
           " torch.zeros(1, 1, dtype=torch.int64)), self.kv_cache)   # bug: a warm-up forward\n"
           "            return []\n")]
