"""Each unit's full (padded flat) gradient is kept on its flat parameter after it was
reduce-scattered (a "last gradient" kept for debugging, or a ``.grad`` left on the full
buffer's leaf): full gradients persist between steps, ZeRO-3's 2Ψ of gradient memory back.
Values stay right.
Caught by: test_only_shards_persist_between_steps (storages allocated in backward still alive
after the step and zero_grad)."""
SELECT = 'test_only_shards_persist'
MESSAGE = 'full gradient kept between steps'
MUTATE = [("            grad = leaf.grad\n            leaf.grad = None\n",
           "            grad = leaf.grad\n            leaf.grad = None\n            f.last_grad = grad\n")]
