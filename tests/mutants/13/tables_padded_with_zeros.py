"""The block tables are padded with 0 instead of -1: block 0 is a real block, so a padded entry looks like a
reference to it (the given model would read it if a context length were wrong; the contract pads with -1).
Caught by: test_model_inputs_are_the_contracts_six_tensors ("padded with -1")."""
SELECT = "test_model_inputs_are_the_contracts_six_tensors"
MESSAGE = "padded with -1"
MUTATE = [("    rows = [list(t) + [-1] * (W - len(t)) for t in block_tables]\n    return ModelInputs(",
           "    rows = [list(t) + [0] * (W - len(t)) for t in block_tables]\n    return ModelInputs(")]
