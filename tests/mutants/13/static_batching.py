"""Static batching: nothing is admitted while any request still runs, so a new request waits for the whole
batch to finish (what Orca's iteration-level scheduling fixes; static_generate's groups).
Caught by: test_requests_join_a_running_batch ("static batching")."""
SELECT = "test_requests_join_a_running_batch"
MESSAGE = "static batching"
MUTATE = [("        if not preempted:                                # 2. admission, only in a step that preempted nobody\n",
           "        if not preempted and not batch:                  # 2. admission (bug: only into an empty batch)\n")]
