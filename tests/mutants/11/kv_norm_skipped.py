"""Bug: kv_norm skipped: the raw latent c_kv is expanded (and cached) without its RMSNorm.

Caught by: test_naive_matches_float64_oracle ("kv_norm looks skipped").
"""
SELECT = "test_naive_matches_float64_oracle and odd-B2"
MESSAGE = 'kv_norm looks skipped'
MUTATE = [("        c_kv = self.kv_norm(c_kv)                                 # the latent, as cached\n", "")]
