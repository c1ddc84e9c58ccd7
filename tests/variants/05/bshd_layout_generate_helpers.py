"""Correct, written another way: the reference with its KVCache and generate redefined after
them (the later definitions are the module's). KVCache keeps one (k, v) buffer pair per
layer in a list, each in Hugging Face's ``(batch, seq, heads, head_dim)`` layout, and returns
transposed slices (still views of that storage) as ``(B, Hkv, S + T, D)``; ``seq_len`` and
``nbytes`` are properties computed from per-layer counts and the buffers. generate keeps the
tokens as a list of chunks, takes the cache's dtype and device from ``lm_head.weight``, and
runs the prefill before its decode loop instead of inside it. Every grader test of Part A must
pass (item (V) of the common items: the graders grade the contract, not the reference's
layout).
"""
MAY_FAIL = []
SELECT = "not paged"
MUTATE = [("# --- Part B (bonus): PagedKVCache", '''# --- (variant) KVCache in the (B, S, Hkv, D) layout, one buffer pair per layer ---

class KVCache:
    """Per-layer ``(k, v)`` buffers of shape ``(batch_size, max_seq_len, n_kv_heads, head_dim)``."""

    def __init__(self, n_layers, batch_size, max_seq_len, n_kv_heads, head_dim,
                 dtype=torch.float32, device="cpu"):
        _positive(n_layers=n_layers, batch_size=batch_size, max_seq_len=max_seq_len,
                  n_kv_heads=n_kv_heads, head_dim=head_dim)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        shape = (batch_size, max_seq_len, n_kv_heads, head_dim)
        self.buffers = [(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))
                        for _ in range(n_layers)]
        self.max_seq_len, self.dtype, self.device = max_seq_len, dtype, self.buffers[0][0].device
        self.stored = [0] * n_layers  # positions each layer holds

    @property
    def seq_len(self) -> int:
        return self.stored[-1]        # advances when the last layer is updated

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.buffers for t in pair)

    def update(self, layer_idx, k, v):
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < len(self.buffers):
            raise ValueError(f"layer_idx must be in [0, {len(self.buffers)}), got {layer_idx!r}")
        B, _, Hkv, D = self.buffers[0][0].shape
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4 or tuple(t.shape[:2]) != (B, Hkv) \\
                    or t.shape[3] != D or t.shape[2] < 1:
                raise ValueError(f"{name} must be ({B}, {Hkv}, T>=1, {D}), got {tuple(getattr(t, 'shape', ()))}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, the cache on {self.device}")
            if t.dtype != self.dtype:
                raise TypeError(f"{name} has dtype {t.dtype}, the cache {self.dtype}")
        if k.shape != v.shape:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
        S, T = self.seq_len, k.shape[2]
        if S + T > self.max_seq_len:
            raise ValueError(f"{S} + {T} positions exceed max_seq_len={self.max_seq_len}")
        kb, vb = self.buffers[layer_idx]
        kb[:, S:S + T] = k.transpose(1, 2)  # (B, T, Hkv, D)
        vb[:, S:S + T] = v.transpose(1, 2)
        self.stored[layer_idx] = S + T
        return kb[:, :S + T].transpose(1, 2), vb[:, :S + T].transpose(1, 2)  # views, (B, Hkv, S + T, D)

    def reset(self) -> None:
        self.stored = [0] * len(self.buffers)


@torch.no_grad()
def generate(model, input_ids, max_new_tokens, attention_mask=None, use_cache=True):
    """Prefill, then a decode loop; tokens kept as a list of chunks."""
    mask = _check_prompt(input_ids, max_new_tokens, attention_mask)
    cfg, (B, L) = model.config, input_ids.shape
    if L + max_new_tokens > cfg.max_seq_len:
        raise ValueError(f"L + max_new_tokens = {L + max_new_tokens} exceeds max_seq_len={cfg.max_seq_len}")
    if max_new_tokens == 0:
        return input_ids.clone()
    head = model.lm_head.weight
    cache = KVCache(cfg.n_layers, B, L + max_new_tokens, cfg.n_kv_heads, cfg.head_dim, dtype=head.dtype,
                    device=head.device) if use_cache else None
    chunks = [input_ids]
    logits = model(input_ids, cache=cache, attention_mask=mask)[:, -1]           # the prefill
    for step in range(max_new_tokens):
        token = logits.argmax(dim=-1, keepdim=True)                              # (B, 1)
        chunks.append(token)
        if step == max_new_tokens - 1:
            break
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        ids = token if use_cache else torch.cat(chunks, dim=1)
        logits = model(ids, cache=cache, attention_mask=mask)[:, -1]
    return torch.cat(chunks, dim=1)


# --- Part B (bonus): PagedKVCache''')]
