"""Bug: the zero point is left fractional while quantizing and truncated by the uint8 cast,
so codes and stored zero point disagree (and 0 is no longer exact).

Caught by: test_asymmetric_round_to_nearest_within_half_scale_and_zero_exact.
"""
SELECT = 'test_asymmetric_round_to_nearest_within_half_scale_and_zero_exact and out3-in20-bits8-row'
MESSAGE = 'zero_point is not round(-min(w, 0) / scale)'
MUTATE = [("    zero_point = torch.round(-lo / safe).clamp(0, qmax)", "    zero_point = (-lo / safe).clamp(0, qmax)"),
          ("    codes = (torch.round(wg / safe[..., None]) + zero_point[..., None]).clamp(0, qmax)",
           "    codes = torch.round(wg / safe[..., None] + zero_point[..., None]).clamp(0, qmax)")]
