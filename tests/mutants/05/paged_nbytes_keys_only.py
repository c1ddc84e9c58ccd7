"""Bug (Part B): PagedKVCache.nbytes counts the key blocks only, not K and V.

Killed by: test_paged_nbytes_and_storage_preallocated.
"""
SELECT = 'test_paged_nbytes_and_storage_preallocated and fp32'
MESSAGE = 'PagedKVCache.nbytes is'
MUTATE = [
    ("self.nbytes = 2 * self.k_blocks.numel() * self.k_blocks.element_size()",
     "self.nbytes = self.k_blocks.numel() * self.k_blocks.element_size()"),
]
