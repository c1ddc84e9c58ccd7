"""The trace is written only when the block ends normally: a timed-out collective (the case the recorder exists
for) leaves no dump. Caught by: test_recorder_real_hang_dumps_name_the_culprit."""
SELECT = 'test_recorder_real_hang_dumps_name_the_culprit and pair'
MESSAGE = 'no dump written'
MUTATE = [
    ('        os.makedirs(self.dump_dir, exist_ok=True)\n',
     '        if exc[0] is not None:\n            return False\n        os.makedirs(self.dump_dir, exist_ok=True)\n'),
]
