"""The draft proposes its argmax even at temperature > 0 while verification receives the sampling
distribution q: the output is no longer the target's distribution (transformers #32867).
Caught by: test_sampling_is_distributed_as_the_target ("lossless speculative sampling")."""
SELECT = 'test_sampling_is_distributed_as_the_target'
MESSAGE = 'lossless speculative sampling'
MUTATE = [('            x = int(q.argmax()) if temperature == 0 else _draw(q, generator)\n', '            x = int(q.argmax())                           # bug: greedy proposals at any temperature\n')]
