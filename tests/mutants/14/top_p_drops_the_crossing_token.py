"""top-p drops the token whose cumulative probability crosses top_p (it compares the mass INCLUDING the
token), so fewer tokens are kept than nucleus sampling's definition (Holtzman et al. 2020) asks.
Caught by: test_top_p_keeps_the_token_that_crosses_top_p ("the token that crosses top_p is kept")."""
SELECT = 'test_top_p_keeps_the_token_that_crosses_top_p'
MESSAGE = 'the token that crosses top_p is kept'
MUTATE = [('        drop = torch.zeros_like(z, dtype=torch.bool).scatter(-1, order, before >= top_p)\n', '        drop = torch.zeros_like(z, dtype=torch.bool).scatter(-1, order, sorted_p.cumsum(-1) > top_p)   # bug\n')]
