"""Every remainder element goes to the last block (pmodels/mpich #2637: "cnts[0..6]=1, cnts[7]=6"): the rank
owning that block sends 2 (p-1) floor(N/p) + (N mod p) log2 p elements, over the bound at p = 8 and N mod 8 >= 5.
Caught by: test_hd_all_reduce_messages_and_elements_per_rank[W8]."""
SELECT = 'test_hd_all_reduce_messages_and_elements_per_rank and W8'
MESSAGE = "too many elements sent for Rabenseifner's all-reduce"
MUTATE = [
    ('    cnts = [N // p + (i < N % p) for i in range(p)]\n',
     '    cnts = [N // p + (N % p if i == p - 1 else 0) for i in range(p)]\n'),
]
