"""The teacher's logits are not detached: with a teacher that requires grad, the loss sends it a gradient
(the teacher is a constant).
Caught by: test_gradients_match_and_ignored_tokens_get_none ("a gradient reached teacher_logits")."""
SELECT = 'test_gradients_match_and_ignored_tokens_get_none and forward_kl'
MESSAGE = 'a gradient reached teacher_logits'
MUTATE = [('    log_pt = F.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)\n', '    log_pt = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)     # bug: not detached\n')]
