"""from_attention does not check qkv.out_features == 3d: a qkv of another width is sharded
anyway, as far as its rows go (ranks 0 and 1 build a module from the wrong rows without
complaint, the last rank's rows run past the end: an IndexError), never the contract's
ValueError naming qkv.out_features.
Caught by: test_from_attention_refuses_sizes_that_do_not_fit[qkv.out_features=33] ("nothing was
raised; the contract's error for a size that does not fit is ValueError")."""
SELECT = "test_from_attention_refuses_sizes_that_do_not_fit and qkv"
MESSAGE = "the contract's error for a size that does not fit is ValueError"
MUTATE = [("        if qkv.out_features != 3 * d:\n"
           "            raise ValueError(f\"qkv.out_features={qkv.out_features} must be 3 * d = {3 * d}\")\n", "")]
