"""Part A shifts by the running max without guarding rows that have seen no key
yet: exp(-inf - (-inf)) = NaN for fully masked rows (causal, Lq > Lk).

Killed by: graders/04/test_part_a_torch.py::test_part_a_matches_float64_attention
(B2-H1-Lq70-Lk19-D16-causal: "NaN in out ... a fully masked row") and
test_part_a_fully_masked_rows_give_zeros_and_minus_inf.
"""
SELECT = 'test_part_a_matches_float64_attention and B2-H1-Lq70-Lk19-D16-causal-bq32-bk8-fp32'
MESSAGE = 'NaN in out (a fully masked row'
MUTATE = [
    ("m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)\n            p = torch.exp(s - m_safe[..., None])",
     "m_safe = m_new\n            p = torch.exp(s - m_safe[..., None])"),
]
