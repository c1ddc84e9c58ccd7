"""Correct, written another way: the 1F1B list built the way torch's ``Schedule1F1B`` counts
it, ``min(p - s, M)`` warm-up forwards and a backward-first steady state (B(i), F(w+i)),
instead of the contract's ``min(p - s - 1, M)`` and forward-first. The contract says both give
the same list: it must lose no point."""
MAY_FAIL = []
SELECT = "schedule or 1f1b or deadlock or holds"
MUTATE = [("    w = min(num_stages - stage - 1, M)\n    out = [(\"F\", m) for m in range(w)]\n"
           "    for i in range(M - w):\n        out += [(\"F\", w + i), (\"B\", i)]\n",
           "    w = min(num_stages - stage, M)\n    out = [(\"F\", m) for m in range(w)]\n"
           "    for i in range(M - w):\n        out += [(\"B\", i), (\"F\", w + i)]\n")]
