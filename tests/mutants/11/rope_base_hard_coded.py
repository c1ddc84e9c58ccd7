"""Bug: a RoPE base other than rope_theta: the angles use the hard-coded 10000 (the common
default, as in many RoPE snippets) whatever the config says. Silent on the DeepSeek-like
config, whose base is 10000 itself; wrong for every other base.

Caught by: test_rope_turns_by_rope_theta ("RoPE turns by the default base 10000 instead of
the config's rope_theta"), and by the value tests of the configs with other bases.
"""
SELECT = "test_rope_turns_by_rope_theta"
MESSAGE = "instead of the config's rope_theta"
MUTATE = [("        cos, sin = _angles(S, L, dr, cfg.rope_theta, wide, x.device)\n",
           "        cos, sin = _angles(S, L, dr, 10000.0, wide, x.device)\n")]
