"""Bug: symmetric codes truncated toward zero (int cast without round) instead of rounded
to nearest; the error grows to a full scale.

Caught by: test_symmetric_rounds_to_nearest_within_half_scale.
"""
SELECT = 'test_symmetric_rounds_to_nearest_within_half_scale and out3-in20-bits8-row'
MESSAGE = 'codes look truncated'
MUTATE = [("    codes = torch.round(wg / safe[..., None]).clamp(-qmax, qmax)",
           "    codes = torch.trunc(wg / safe[..., None]).clamp(-qmax, qmax)")]
