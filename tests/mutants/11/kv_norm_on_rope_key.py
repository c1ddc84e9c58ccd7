"""Bug: kv_norm applied to the rope key too: k_rope goes through an RMS normalisation
(eps 1e-6, no weight) before RoPE, as if the whole [c_kv | k_rope] output of wkv_a were
normalised; the contract normalises c_kv only.

Caught by: test_naive_matches_float64_oracle ("kv_norm (an RMS normalisation) looks
applied to the rope key too").
"""
SELECT = "test_naive_matches_float64_oracle and odd-B2"
MESSAGE = 'kv_norm (an RMS normalisation) looks applied to the rope key too'
MUTATE = [("        c_kv = self.kv_norm(c_kv)                                 # the latent, as cached\n",
           "        c_kv = self.kv_norm(c_kv)\n"
           "        k_rope = F.rms_norm(k_rope, (dr,), eps=1e-6)              # normalised too\n")]
