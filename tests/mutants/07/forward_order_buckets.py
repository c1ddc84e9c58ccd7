"""Buckets built in forward parameter order (the first layers' gradients, which backward produces last, in bucket 0: no overlap).
Caught by: test_bucket_partition_reverse_order_cap_and_dtype ("buckets in forward order")."""
SELECT = 'test_bucket_partition_reverse_order_cap_and_dtype'
MESSAGE = 'buckets in forward order'
MUTATE = [("    for name, p in reversed(list(named_params)):\n", "    for name, p in list(named_params):\n")]
