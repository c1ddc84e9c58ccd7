"""A correct lab 16 that returns numpy scalars where the contract asks for floats (the ring and DP times, MFU,
parse_bytes, Young's interval, compute_optimal's pair: np.float64, which crosses the sandbox as a handle read
back through .item()), and fits with a shorter L-BFGS memory (history_size=10) over the mean-free sum computed
by torch.nn.functional.huber_loss.
Proves (issue 32): numbers are graded by value, whatever scalar type carries a float, and the fit's starts
are ones L-BFGS reaches the minimum from with another memory size too (10: the short memory the graders
check each start with; with 20, unchecked, a published-runs start crawled 1 time in 30, so this variant failed
when both of a test's two starts did: about 1 run in 1000, a flake)."""
MAY_FAIL = []
MUTATE = [("import torch.nn.functional as F\n", "import torch.nn.functional as F\nimport numpy as np\n"),
          ("    return 2 * (W - 1) * alpha + 2 * (W - 1) / W * n_bytes / bandwidth",
           "    return np.float64(2 * (W - 1) * alpha + 2 * (W - 1) / W * n_bytes / bandwidth)"),
          ('    return training_flops_per_token(cfg, "none") * tokens_per_second / (peak_flops * n_gpus)',
           '    return np.float64(training_flops_per_token(cfg, "none")) * tokens_per_second / (peak_flops * n_gpus)'),
          ("    return float(value)\n", "    return np.float64(value)\n"),
          ("        done = max(ready, done) + comm\n    return done\n",
           "        done = max(ready, done) + comm\n    return np.float64(done)\n"),
          ("    return math.sqrt(2 * checkpoint_time * node_mtbf / n_nodes)",
           "    return np.sqrt(np.float64(2 * checkpoint_time * node_mtbf / n_nodes))"),
          ("    return G * (C / 6) ** (b / (a + b)), (C / 6) ** (a / (a + b)) / G",
           "    return np.float64(G * (C / 6) ** (b / (a + b))), np.float64((C / 6) ** (a / (a + b)) / G)"),
          ("    return torch.where(r.abs() <= delta, 0.5 * r * r, delta * (r.abs() - 0.5 * delta)).sum()",
           "    return F.huber_loss(pred, logL, reduction=\"sum\", delta=delta)"),
          ("                                line_search_fn=\"strong_wolfe\")",
           "                                history_size=10, line_search_fn=\"strong_wolfe\")")]
