"""route's gates as a softmax over the k selected logits (float32) instead of the renormalised top-k probabilities:
the same gates up to rounding, as the contract says; it must lose nothing (Part A's route tests and the layer's)."""
MAY_FAIL = []
SELECT = "route or moe_matches or moe_gradients"
MUTATE = [("    return idx, top / top.sum(dim=-1, keepdim=True)\n",
           "    return idx, torch.softmax(logits.float().gather(1, idx), dim=-1)\n")]
