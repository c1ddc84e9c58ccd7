"""Parts A and B written another way, appended after the reference so they replace it: ``logits_to_probs`` row by
row in Python floats (float64), top-p by a sorted list; ``speculative_sample`` with ``gather``/``argmax`` for the first
rejection and a uniform against the inverse CDF instead of ``torch.multinomial`` (another random stream);
``speculative_generate`` with a SEPARATE prefill call of the prompt's first L-1 tokens in each model (the
contract's "+1"), proposals drawn by inverse CDF, verification through the public ``speculative_sample`` (with its
checks). Proves: the graders read distributions and calls, not the reference's random stream or its merged
prefill."""
MAY_FAIL = []
SELECT = 'test_sampling or (test_generate and not accepted_counts)'   # the acceptance-count run set: the other variant's
MUTATE = [('    return alpha * temperature ** 2 * soft + (1 - alpha) * hard\n',
           '    return alpha * temperature ** 2 * soft + (1 - alpha) * hard\n' '''

# --- the variant: Parts A and B again, another way-------------------------------------------------

def logits_to_probs(logits, temperature=1.0, top_k=None, top_p=None):  # noqa: F811 - replaces the reference's
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be floating, got {getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (..., V) with V >= 1, got {tuple(logits.shape)}")
    _check_sampling(temperature, top_k, top_p)
    if bool(torch.isnan(logits).any()) or bool((logits == math.inf).any()):
        raise ValueError("logits hold NaN or +inf")
    V = logits.shape[-1]
    out = []
    for z in logits.detach().to("cpu", torch.float64).reshape(-1, V).tolist():   # Python floats (float64)
        if temperature == 0:
            out.append([float(i == z.index(max(z))) for i in range(V)])
            continue
        z = [v / temperature for v in z]
        keep = [v > -math.inf for v in z]
        if top_k is not None and top_k < V:
            kth = sorted(z, reverse=True)[top_k - 1]
            keep = [k and v >= kth for k, v in zip(keep, z)]
        if top_p is not None and top_p < 1:
            m = max(v for v, k in zip(z, keep) if k)
            w = [math.exp(v - m) if k else 0.0 for v, k in zip(z, keep)]
            total, mass = sum(w), 0.0
            for i in sorted(range(V), key=lambda i: (-w[i], i)):
                keep[i] = keep[i] and mass < top_p
                mass += w[i] / total
        m = max(v for v, k in zip(z, keep) if k)
        w = [math.exp(v - m) if k else 0.0 for v, k in zip(z, keep)]
        total = sum(w)
        out.append([x / total for x in w])
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return torch.tensor(out, dtype=torch.float64).reshape(logits.shape).to(dtype=dtype, device=logits.device)


def _inverse_cdf(w, generator):
    """An index per row of weights ``w (..., V)``: one uniform against the normalised CDF (a zero weight is never
    drawn; a uniform past a CDF that rounds below 1 takes the last token of positive weight)."""
    c = torch.cumsum(w / w.sum(-1, keepdim=True), -1)
    u = torch.rand(c.shape[:-1] + (1,), generator=generator, dtype=c.dtype, device=c.device)
    idx = torch.searchsorted(c, u, right=True).squeeze(-1)
    last = (w > 0).to(torch.int64).cumsum(-1).argmax(-1)        # the last index of positive weight
    return torch.minimum(idx, last)


def speculative_sample(draft_probs, target_probs, draft_tokens, generator=None):  # noqa: F811
    B, gamma, V = _ref_sample_checks(draft_probs, target_probs, draft_tokens)
    x = draft_tokens
    u = torch.rand((B, gamma), generator=generator, dtype=draft_probs.dtype, device=draft_probs.device)
    ok = u * draft_probs.gather(2, x[..., None])[..., 0] < target_probs[:, :gamma].gather(2, x[..., None])[..., 0]
    # n = the first rejected position (gamma when none): the index of the first False in [ok, False]
    n = torch.cat([ok, ok.new_zeros(B, 1)], 1).logical_not().to(torch.int8).argmax(1).to(torch.int64)
    pick = n[:, None, None].expand(B, 1, V)
    p_n = target_probs.gather(1, pick)[:, 0]
    q_n = torch.cat([draft_probs, draft_probs.new_zeros(B, 1, V)], 1).gather(1, pick)[:, 0]
    w = torch.clamp(p_n - q_n, min=0)
    w = torch.where(w.sum(-1, keepdim=True) == 0, p_n, w)
    last = _inverse_cdf(w, generator)
    j = torch.arange(gamma + 1, device=x.device)[None]
    tokens = torch.where(j < n[:, None], torch.cat([x, x.new_zeros(B, 1)], 1), -1)
    tokens = torch.where(j == n[:, None], last[:, None], tokens)
    return tokens, n


def _ref_sample_checks(draft_probs, target_probs, draft_tokens):
    """The reference's argument checks (the same contract), then the sizes."""
    for name, t, rank in (("draft_probs", draft_probs, 3), ("target_probs", target_probs, 3),
                          ("draft_tokens", draft_tokens, 2)):
        if not isinstance(t, torch.Tensor) or t.dim() != rank:
            raise ValueError(f"{name} must be a tensor of rank {rank}")
    if draft_tokens.dtype != torch.int64:
        raise TypeError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
    if draft_probs.dtype not in (torch.float32, torch.float64) or target_probs.dtype != draft_probs.dtype:
        raise TypeError("draft_probs and target_probs must be both float32 or both float64")
    B, gamma, V = draft_probs.shape
    if tuple(target_probs.shape) != (B, gamma + 1, V):
        raise ValueError("target_probs must be (B, gamma+1, V)")
    if tuple(draft_tokens.shape) != (B, gamma):
        raise ValueError("draft_tokens must be (B, gamma)")
    _check_probs("draft_probs", draft_probs)
    _check_probs("target_probs", target_probs)
    if bool(((draft_tokens < 0) | (draft_tokens >= V)).any()):
        raise ValueError("draft_tokens: a token outside [0, V)")
    if bool((draft_probs.gather(-1, draft_tokens[..., None]) == 0).any()):
        raise ValueError("draft_tokens: a proposal of draft probability 0")
    return B, gamma, V


@torch.no_grad()
def speculative_generate(target, draft, input_ids, gamma, max_new_tokens, temperature=0.0, top_k=None,  # noqa: F811
                         top_p=None, generator=None):
    """Separate prefill calls of the prompt's first L-1 tokens, then blocks; the public functions throughout."""
    if not _is_int(gamma) or gamma < 1:
        raise ValueError(f"gamma must be an int >= 1, got {gamma!r}")
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    _check_sampling(temperature, top_k, top_p)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.int64:
        raise TypeError("input_ids must be an int64 tensor")
    V = target.config.vocab_size
    if draft.config.vocab_size != V:
        raise ValueError("vocab_size differs between draft and target")
    if (input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1
            or bool(((input_ids < 0) | (input_ids >= V)).any())):
        raise ValueError("input_ids must be (1, L), L >= 1, ids in the vocabulary")
    L = input_ids.shape[1]
    total = L + max_new_tokens
    if total > min(target.config.max_seq_len, draft.config.max_seq_len):
        raise ValueError("L + max_new_tokens exceeds max_seq_len")
    stats = SpecStats()
    out = input_ids[0].tolist()
    if max_new_tokens == 0:
        return input_ids.clone(), stats
    dev = input_ids.device
    caches = {id(target): target.make_cache(1, total), id(draft): draft.make_cache(1, total)}
    if L > 1:
        for m in (target, draft):
            m(input_ids[:, :L - 1], cache=caches[id(m)])
        stats.target_calls += 1
        stats.draft_calls += 1
    while len(out) < total:
        N, g = len(out), min(gamma, total - len(out) - 1)
        ext, q_rows = list(out), []
        for _ in range(g):
            c = caches[id(draft)]
            q = logits_to_probs(draft(torch.tensor([ext[c.seq_len:]], device=dev), cache=c)[0, -1:], temperature,
                                top_k, top_p).double()
            stats.draft_calls += 1
            ext.append(int(q[0].argmax()) if temperature == 0 else int(_inverse_cdf(q[0], generator)))
            q_rows.append(q)
        c = caches[id(target)]
        p = logits_to_probs(target(torch.tensor([ext[c.seq_len:]], device=dev), cache=c)[0, -(g + 1):], temperature,
                            top_k, top_p).double()
        stats.target_calls += 1
        q = torch.cat(q_rows)[None] if q_rows else p.new_zeros(1, 0, V)
        tokens, n = speculative_sample(q, p[None], torch.tensor([ext[N:]], dtype=torch.int64, device=dev), generator)
        n = int(n)
        out.extend(tokens[0, :n + 1].tolist())
        stats.blocks, stats.proposed, stats.accepted = stats.blocks + 1, stats.proposed + g, stats.accepted + n
        for cc in caches.values():
            cc.crop(min(cc.seq_len, N + n))
    return torch.tensor([out], dtype=torch.int64, device=dev), stats
''')]
