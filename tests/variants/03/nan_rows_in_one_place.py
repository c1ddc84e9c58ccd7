"""Bug: no guard for a fully masked row (the mutant nan_on_fully_masked_rows): its max is -inf and
exp(-inf - -inf) = NaN, so a query that sees no key (causal, Lq > Lk) outputs NaN, not zeros.

Issue "Graders that charge one deviation once": graded in one place, the fully-masked-rows test.
The causal-mask test's Lq > Lk cases also have such rows; it grades the mask's alignment on the
rows that see at least one key, where the guard cannot matter, so it passes."""
MUTATE = [("    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)\n", "")]
BUG = True
MESSAGE = "see no key and must output exact zeros"
MAY_FAIL = ["test_fully_masked_rows_give_zeros_not_nan"]
SELECT = "causal_mask or fully_masked"
