"""The reference plus words that name block pointers without using them: the stub's own
comment ("tl.advance (removed in Triton 3.9)"), a docstring naming tl.make_block_ptr, and a
host-side helper with its own ``advance(`` method that sizes the grid. The no-block-pointer
rule reads calls of triton.language, not words (issue 13, point 3).
"""
MUTATE = [
    ("def _launch_config(q) -> dict:",
     "class _Blocks:\n"
     "    \"\"\"Host-side count of query blocks (plain Python, not tl.make_block_ptr).\"\"\"\n\n"
     "    def __init__(self, size):\n"
     "        self.size, self.count = size, 0\n\n"
     "    def advance(self, length):\n"
     "        self.count = triton.cdiv(length, self.size)\n"
     "        return self.count\n\n\n"
     "# Do not use tl.make_block_ptr or tl.advance (removed in Triton 3.9).\n"
     "def _launch_config(q) -> dict:"),
    ("grid = (triton.cdiv(Lq, cfg[\"BLOCK_M\"]), B * H)", "grid = (_Blocks(cfg[\"BLOCK_M\"]).advance(Lq), B * H)"),
]
MAY_FAIL = []
SELECT = "test_part_b_uses_no_block_pointers"
