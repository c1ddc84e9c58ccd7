"""Triton wrapper passes the strides of a contiguous tensor of q's, k's and v's
shape instead of the tensors' own strides (assumes contiguous inputs).

Killed by: graders/04/test_part_b_triton.py::test_part_b_noncontiguous_inputs.
"""
SELECT = 'test_part_b_noncontiguous_inputs and qstrided-ktransposed-vstrided'
MESSAGE = 'the result depends on the layout'
MUTATE = [
    ("*q.stride(), *k.stride(), *v.stride(),",
     "*torch.empty(q.shape, device=\"meta\").stride(), *torch.empty(k.shape, device=\"meta\").stride(), "
     "*torch.empty(v.shape, device=\"meta\").stride(),"),
]
