"""Only the last rank's shard is padded before the all-gather: the code assumes every other rank
owns c = ceil(N/W) real elements, which fails once ceil(N/W)*(W-1) > N (N = 5 on W = 4: rank 2
owns 1 element, rank 3 none, and rank 2's short shard breaks the all-gather).
Caught by: test_n_not_divisible_by_w_padding_never_leaks[W4-N5] (and test_a_rank_that_owns_nothing[N2])."""
SELECT = 'test_n_not_divisible_by_w_padding_never_leaks and W4-N5'
MESSAGE = 'more than the last rank may be short'
MUTATE = [("""            mine = torch.zeros(c, dtype=torch.float32, device=device)
            for p, _, off in self._layout:
                a, b = self._owned(off, p.numel())
                if b > a:
                    mine[off + a - self.lo: off + b - self.lo] = p.view(-1)[a:b]
""", """            mine = torch.cat([p.view(-1)[slice(*self._owned(off, p.numel()))] for p, _, off in self._layout])
            if self.rank == W - 1:  # the last rank's shard is the short one: pad it to c
                mine = torch.cat([mine, mine.new_zeros(c - mine.numel())])
""")]
