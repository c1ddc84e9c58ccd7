"""Bug: shards of n // W parameters; with n not a multiple of W the last rank's padded
shard is ceil(n / W).

Source: DeepSpeed pads the flat partitions to a multiple of the world size (ZeRO stage 1/2
optimizer), as lab 02 owns ceil-sized ranges.
Caught by: test_zero_shards_round_up.
"""
SELECT = 'test_zero_shards_round_up'
MESSAGE = 'shards rounded down'
MUTATE = [
    ('    S = -(-n // world_size) ',
     '    S = n // world_size '),
]
