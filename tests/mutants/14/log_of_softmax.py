"""The losses take log(softmax(z / T)) instead of log_softmax: softmax underflows to 0 for large logits and
the log gives -inf (NaN in the KL).
Caught by: test_losses_are_stable_for_huge_logits ("never log(softmax)")."""
SELECT = 'test_losses_are_stable_for_huge_logits'
MESSAGE = 'never log(softmax)'
MUTATE = [('    log_ps = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)\n', '    log_ps = torch.log(F.softmax(student_logits.to(dtype) / temperature, dim=-1))   # bug: unstable\n')]
