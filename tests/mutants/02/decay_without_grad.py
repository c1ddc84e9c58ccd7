"""Weight decay is applied to every owned parameter, also those with no gradient on any rank.
Caught by: test_grad_none_on_all_ranks_leaves_param_unchanged[W2-never]."""
SELECT = 'test_grad_none_on_all_ranks_leaves_param_unchanged and W2-never'
MESSAGE = 'must stay unchanged in that step'
MUTATE = [("""            if b <= a or not has_grad[i]:
                continue
            g = self.param_groups[gi]
            lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]""",
"""            if b <= a:
                continue
            g = self.param_groups[gi]
            lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
            if not has_grad[i]:
                p.view(-1)[a:b].mul_(1 - lr * wd)
                continue""")]
