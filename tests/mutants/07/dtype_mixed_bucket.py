"""Buckets ignore dtype: float32 and float64 gradients share one flat buffer (torch.cat promotes the float32 ones).
Caught by: test_bucket_partition_reverse_order_cap_and_dtype ("has another dtype")."""
SELECT = 'test_bucket_partition_reverse_order_cap_and_dtype'
MESSAGE = 'mixes float32 and float64 gradients'
MUTATE = [("        if buckets and (p.dtype, p.device) == key and size + nbytes <= cap_bytes:\n",
           "        if buckets and size + nbytes <= cap_bytes:\n")]
