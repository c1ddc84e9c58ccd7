"""The reference plus an unused ``import einops`` at the top: the handout's "Packages" note lets a
submission import the standard library, torch, numpy and einops, so this loses nothing.

Issue point 8: einops is in the lock and importable inside the sandbox worker."""
MUTATE = [("from __future__ import annotations\n", "from __future__ import annotations\n\nimport einops  # noqa: F401\n")]
MAY_FAIL = []
SELECT = "query_head_uses"
