"""Parts A (sampling) and C written another way, appended after the reference so they replace it: the
verification step walks the positions with a mask of rows still alive and draws the correction/bonus token by an
exponential race (``argmax(log w - log E)``, E ~ Exp(1)) instead of ``torch.multinomial``; the losses use
``F.kl_div(log_target=True)``, ``torch.logaddexp`` for the GKD mixture, boolean indexing for the mask and
``F.cross_entropy(reduction="sum")`` for the hard term. Proves: another random stream and torch's own KL pass
every statistical and closed-form test."""
MAY_FAIL = []
SELECT = 'test_sampling or test_losses or test_sampling_is_distributed or test_accepted_counts'
MUTATE = [('    return alpha * temperature ** 2 * soft + (1 - alpha) * hard\n',
           '    return alpha * temperature ** 2 * soft + (1 - alpha) * hard\n' '''

# --- the variant: the race sampler and the losses through torch's own ops --------------------------

def _race(w, generator):
    """An exponential race: ``argmax(log w - log E)``, E ~ Exp(1) per token (Gumbel-max by another name); a
    weight of 0 never wins. ``w (B, V)`` unnormalised."""
    e = -torch.log1p(-torch.rand(w.shape, generator=generator, dtype=w.dtype, device=w.device))   # Exp(1)
    score = torch.where(w > 0, torch.log(w) - torch.log(e), torch.full_like(w, -math.inf))
    return score.argmax(-1)


def _verify(draft_probs, target_probs, draft_tokens, generator):  # noqa: F811 - replaces the reference's
    B, gamma, V = draft_probs.shape
    n = torch.full((B,), gamma, dtype=torch.int64, device=draft_tokens.device)
    alive = torch.ones(B, dtype=torch.bool, device=draft_tokens.device)
    for i in range(gamma):                         # position by position, over all rows at once
        x = draft_tokens[:, i:i + 1]
        u = torch.rand(B, generator=generator, dtype=draft_probs.dtype, device=draft_probs.device)
        ok = u * draft_probs[:, i].gather(1, x)[:, 0] < target_probs[:, i].gather(1, x)[:, 0]
        n = torch.where(alive & ~ok, torch.full_like(n, i), n)
        alive &= ok
    rows = torch.arange(B, device=n.device)
    p_n = target_probs[rows, n]
    q_n = torch.where((n < gamma)[:, None], draft_probs[rows, n.clamp(max=max(gamma - 1, 0))] if gamma
                      else torch.zeros_like(p_n), torch.zeros_like(p_n))
    w = (p_n - q_n).clamp(min=0)
    w = torch.where((w.sum(-1) > 0)[:, None], w, p_n)
    tokens = torch.full((B, gamma + 1), -1, dtype=torch.int64, device=n.device)
    for i in range(gamma):
        tokens[:, i] = torch.where(i < n, draft_tokens[:, i], tokens[:, i])
    tokens[rows, n] = _race(w, generator)
    return tokens, n


def _masked_mean(per_token, valid):
    """Boolean indexing keeps only the valid tokens (the others get no gradient at all)."""
    return per_token[valid].sum() / max(int(valid.sum()), 1)


def _kl_div(log_a, log_b):
    """Per token KL(a || b) by torch's kl_div (input = log b, target = log a)."""
    return F.kl_div(log_b, log_a, reduction="none", log_target=True).sum(-1)


def forward_kl(student_logits, teacher_logits, labels=None, temperature=1.0, ignore_index=-100):  # noqa: F811
    log_ps, log_pt, valid = _prepare(student_logits, teacher_logits, labels, temperature, ignore_index)
    return _masked_mean(_kl_div(log_pt, log_ps), valid)


def reverse_kl(student_logits, teacher_logits, labels=None, temperature=1.0, ignore_index=-100):  # noqa: F811
    log_ps, log_pt, valid = _prepare(student_logits, teacher_logits, labels, temperature, ignore_index)
    return _masked_mean(_kl_div(log_ps, log_pt), valid)


def generalized_jsd(student_logits, teacher_logits, labels=None, beta=0.5, temperature=1.0,  # noqa: F811
                    ignore_index=-100):
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 <= beta <= 1:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    log_ps, log_pt, valid = _prepare(student_logits, teacher_logits, labels, temperature, ignore_index)
    if beta in (0, 1):
        per = _kl_div(log_pt, log_ps) if beta == 0 else _kl_div(log_ps, log_pt)
    else:
        log_m = torch.logaddexp(log_pt + math.log(beta), log_ps + math.log1p(-beta))
        per = beta * _kl_div(log_pt, log_m) + (1 - beta) * _kl_div(log_ps, log_m)
    return _masked_mean(per, valid)


def distillation_loss(student_logits, teacher_logits, labels, temperature=1.0, alpha=0.5,  # noqa: F811
                      ignore_index=-100):
    if labels is None:
        raise ValueError("labels are required")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    log_ps, log_pt, valid = _prepare(student_logits, teacher_logits, labels, temperature, ignore_index)
    V = student_logits.shape[-1]
    if bool(((labels[valid] < 0) | (labels[valid] >= V)).any()):
        raise ValueError("labels: a valid label outside [0, V)")
    count = max(int(valid.sum()), 1)
    hard = F.cross_entropy(student_logits.to(log_ps.dtype).reshape(-1, V), labels.reshape(-1).long(),
                           ignore_index=ignore_index, reduction="sum") / count
    return alpha * temperature ** 2 * forward_kl(student_logits, teacher_logits, labels, temperature,
                                                 ignore_index) + (1 - alpha) * hard
''')]
