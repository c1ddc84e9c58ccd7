"""Frozen shards get a zero ``.grad`` at each backward (set beside the trainable shard's): the
gradient values are right and plain SGD leaves them unchanged, but ``torch.optim.AdamW``
applies its decoupled weight decay to every parameter whose ``.grad`` is not None, so the
frozen parameters shrink at every step (the contract: frozen parameters never change, also
under AdamW's weight decay; its note 4 cites pytorch/pytorch #104690 for frozen flats).
Caught by: test_torch_optimizer_steps_the_shards[adamw]."""
SELECT = 'test_torch_optimizer_steps_the_shards and adamw'
MESSAGE = 'a frozen shard changed'
MUTATE = [("            if f.shard.grad is None:\n                f.shard.grad = out\n",
           "            frozen = self._flats[i][1]\n"
           "            if frozen is not None and frozen.shard.grad is None:\n"
           "                frozen.shard.grad = torch.zeros_like(frozen.shard)\n"
           "            if f.shard.grad is None:\n                f.shard.grad = out\n")]
