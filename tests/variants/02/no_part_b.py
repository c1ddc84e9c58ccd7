"""Parts A and C done, Part B not: no global norm, no clipping (it raises NotImplementedError
when max_grad_norm is set, as a stub would) and no grad_norm attribute at all. Issue 13 point 1:
Part A's and C's tests pass on their own parts; only Part B's may fail."""
MAY_FAIL = ["part B"]
SELECT = "group_is_honoured or a_rank_that_owns_nothing or state_is_sharded and W4"
MUTATE = [
    ("        self.grad_norm = None\n", ""),
    ("""        # 2. Global norm of the averaged gradient, from every shard's sum of squares.
        sq = (shard.double() ** 2).sum().float().reshape(1)
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.group)
        self.grad_norm = sq.sqrt().reshape(())
        if self.max_grad_norm is not None:
            # torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1
            coef = torch.clamp(self.max_grad_norm / (self.grad_norm + 1e-6), max=1.0)
            shard *= coef
""", """        # 2. Part B (not done yet): the global norm and clipping.
        if self.max_grad_norm is not None:
            raise NotImplementedError("Part B: global grad norm and clipping")
"""),
]
