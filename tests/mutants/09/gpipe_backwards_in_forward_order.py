"""GPipe's backwards run B0 .. B(M-1) (forward order) instead of B(M-1) .. B0.
Caught by: test_schedule_action_by_action[gpipe] ("backwards in forward order")."""
MESSAGE = 'backwards in forward order'
SELECT = 'test_schedule_action_by_action and gpipe'
MUTATE = [("        return [(\"F\", m) for m in range(M)] + [(\"B\", m) for m in reversed(range(M))]\n",
           "        return [(\"F\", m) for m in range(M)] + [(\"B\", m) for m in range(M)]\n")]
