"""The cap is read as 10**6 bytes, not MiB (2**20 bytes).
Caught by: test_bucket_partition_reverse_order_cap_and_dtype ("the cap is read in megabytes")."""
SELECT = 'test_bucket_partition_reverse_order_cap_and_dtype'
MESSAGE = 'the cap is read in megabytes'
MUTATE = [("        self.buckets = make_buckets(named, cap * 2**20)\n", "        self.buckets = make_buckets(named, cap * 10**6)\n")]
