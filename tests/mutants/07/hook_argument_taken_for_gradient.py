"""The post-accumulate-grad hook's argument taken for the gradient: ``register_post_accumulate_grad_hook``
calls ``hook(param)``, but the DDP treats that tensor as the gradient, so each bucket all-reduces
(and averages back into) the parameters themselves while every ``.grad`` stays this rank's own.
A real bug class: the hook's signature differs from ``Tensor.register_hook``'s ``hook(grad)``
(torch docs, ``Tensor.register_post_accumulate_grad_hook``: "the hook ... takes the tensor as
argument").
Caught by: test_matches_single_process_training_on_the_concatenated_batch[W2] ("the gradients were not averaged")."""
SELECT = 'test_matches_single_process_training_on_the_concatenated_batch and W2'
MESSAGE = 'the gradients were not averaged'
MUTATE = [("        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])\n",
           "        flat = torch.cat([p.detach().reshape(-1) for p in ps])  # the hook's argument as the gradient\n"),
          ("                if p.grad is None:\n                    p.grad = g.clone()\n                else:\n"
           "                    p.grad.copy_(g)\n", "                p.detach().copy_(g)\n")]
