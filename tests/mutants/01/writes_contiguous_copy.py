"""The result is written into tensor.contiguous(): for a strided or transposed view that is
a copy, so the caller's tensor never sees the result.
Caught by: test_all_reduce_strided_views_in_place[transposed]."""
SELECT = 'test_all_reduce_strided_views_in_place and transposed'
MESSAGE = "the result must land in the caller's view"
MUTATE = [("    tensor.copy_(out.view(-1)[: tensor.numel()].view(tensor.shape))",
           "    tensor.contiguous().copy_(out.view(-1)[: tensor.numel()].view(tensor.shape))")]
