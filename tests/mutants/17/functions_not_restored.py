"""__exit__ leaves the recording wrappers installed on torch.distributed.
Caught by: test_recorder_changes_no_result_and_restores_torch_distributed."""
SELECT = 'test_recorder_changes_no_result_and_restores_torch_distributed'
MESSAGE = 'not the original objects again'
MUTATE = [
    ('        for name, original in self._saved.items():\n            setattr(dist, name, original)\n',
     ''),
]
