"""Allocates exp_avg / exp_avg_sq for the whole parameter and keeps a slice of it: the
values are right but every rank stores full-size state (the storage is what counts).
Caught by: test_optimizer_state_is_sharded[W2]."""
SELECT = 'test_optimizer_state_is_sharded and W2'
MESSAGE = 'optimizer state is not sharded'
MUTATE = [("""                state["exp_avg"] = torch.zeros(b - a, dtype=torch.float32, device=device)
                state["exp_avg_sq"] = torch.zeros(b - a, dtype=torch.float32, device=device)""",
"""                state["exp_avg"] = torch.zeros(p.numel(), dtype=torch.float32, device=device)[a:b]
                state["exp_avg_sq"] = torch.zeros(p.numel(), dtype=torch.float32, device=device)[a:b]""")]
