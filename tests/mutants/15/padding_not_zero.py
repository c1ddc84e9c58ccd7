"""The flat is padded with ones instead of zeros: the padding of the shards is not 0.
Caught by: test_padding_with_units_of_2_10_18_elements[W4]."""
SELECT = 'test_padding and W4'
MESSAGE = 'padding not zero'
MUTATE = [("flat = torch.nn.functional.pad(flat, (0, self.W * c - N))",
           "flat = torch.nn.functional.pad(flat, (0, self.W * c - N), value=1.0)")]
