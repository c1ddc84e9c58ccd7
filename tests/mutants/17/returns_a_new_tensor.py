"""The result is returned as a new tensor and never written through the caller's view (the in-place contract of
torch.distributed's collectives). Caught by: test_hd_all_reduce_writes_through_views."""
SELECT = 'test_hd_all_reduce_writes_through_views'
MESSAGE = "did not write the result through the caller's view"
MUTATE = [
    ('    tensor.copy_(flat.view(tensor.shape).to(tensor.dtype))\n    return tensor\n',
     '    return flat.view(tensor.shape).to(tensor.dtype)\n'),
]
