"""Bug: the layer keeps the decompressed per-head K/V of its last call (self._kv, "for
reuse"): (B, Lk, H, qk_nope + v) held between calls, the per-token per-head memory the
latent cache exists to avoid.

Caught by: test_no_per_head_per_token_tensor_kept[naive] ("the layer keeps a per-head,
per-token tensor after forward").
"""
SELECT = "test_no_per_head_per_token_tensor_kept and naive"
MESSAGE = 'the layer keeps a per-head, per-token tensor after forward'
MUTATE = [("            kv = self.wkv_b(c_all).view(B, Lk, H, dn + dv).to(wide)\n",
           "            kv = self.wkv_b(c_all).view(B, Lk, H, dn + dv).to(wide)\n"
           "            self._kv = kv   # kept for reuse\n")]
