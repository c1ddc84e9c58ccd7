"""The divergence is computed in the logits' own dtype: bfloat16 logits are not upcast before log_softmax
(negative JSD values, modelscope/ms-swift #10156).
Caught by: test_low_precision_logits_are_upcast ("upcast before")."""
SELECT = 'test_low_precision_logits_are_upcast'
MESSAGE = 'upcast before'
MUTATE = [('    dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32\n', '    dtype = student_logits.dtype                                # bug: no upcast\n')]
