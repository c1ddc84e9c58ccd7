"""Parts A and B written the way Hugging Face's Mixtral is (transformers ``MixtralSparseMoeBlock`` and
``load_balancing_loss_func``), where the contract allows it: the assignments as a one-hot ``(E, k, T)`` expert mask,
each expert run on ``torch.where(expert_mask[e])`` and its gated output ``index_add_``-ed in place; capacity as a mask
on that one-hot (cumulative counts per expert over the tokens); the aux loss from the one-hot ``(T, k, E)`` averaged
over the tokens, then over the k slots (transformers sums over them: k times the contract's f_e). Another
decomposition and other internal layouts, correct: it must lose nothing (Parts A and B; Part C is the reference's)."""
MAY_FAIL = []
SELECT = "route or load_balancing or capacity or moe_"
MUTATE = [
    ("""    flat = expert_idx.reshape(-1)
    counts = torch.zeros(num_experts, dtype=probs.dtype, device=probs.device)
    counts = counts.index_add(0, flat, torch.ones(flat.numel(), dtype=probs.dtype, device=probs.device))
    f = counts / max(flat.numel(), 1)
    return num_experts * (f * probs.mean(dim=0)).sum()
""", """    expert_mask = F.one_hot(expert_idx, num_experts).to(probs.dtype)      # (T, k, E)
    tokens_per_expert = expert_mask.mean(dim=0)                            # (k, E): per slot, the fraction of tokens
    router_prob_per_expert = probs.mean(dim=0)                             # (E,)
    # transformers sums over the k slots; the contract's f_e is over the T*k assignments: the mean over them
    return num_experts * (tokens_per_expert.mean(dim=0) * router_prob_per_expert).sum()
"""),
    ("""        T, E = x.shape[0], self.num_experts
        logits = self.router(x)                                         # (T, E)
        idx, gates = route(logits, self.k)                              # (T, k) each
        aux = load_balancing_loss(torch.softmax(logits.float(), dim=-1), idx, E)
        hot = _assignments(idx, E)                                      # (T, E)
        keep = hot.bool()
        if self.capacity_factor is not None:
            keep = keep & (_positions(hot) < capacity(T, E, self.k, self.capacity_factor))
        table = torch.zeros_like(hot).scatter(1, idx, gates) * keep     # (T, E) kept gates
        return _run_experts(self.experts, x, table, keep).to(x.dtype), aux
""", """        T, E = x.shape[0], self.num_experts
        router_logits = self.router(x)                                          # (T, E)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)    # (T, E)
        selected_experts, gates = route(router_logits, self.k)                  # (T, k): a stable sort, not topk
        aux = load_balancing_loss(routing_weights, selected_experts, E)
        expert_mask = F.one_hot(selected_experts, num_classes=E).permute(2, 1, 0)   # (E, k, T)
        if self.capacity_factor is not None:
            per_token = expert_mask.sum(dim=1)                                  # (E, T): 0 or 1
            place = per_token.cumsum(dim=1) - per_token                         # earlier tokens of the same expert
            C = capacity(T, E, self.k, self.capacity_factor)
            expert_mask = expert_mask * (place < C).unsqueeze(1)
        final = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
        for e, expert in enumerate(self.experts):
            slot, top_x = torch.where(expert_mask[e])                           # the kept (slot, token) pairs
            current = expert(x[top_x]).float() * gates[top_x, slot, None]
            final.index_add_(0, top_x, current)
        return final.to(x.dtype), aux
"""),
]
