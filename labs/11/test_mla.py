"""Visible tests for lab 11 (a useful subset; the hidden graders check more).

Run: pytest labs/11                 (all)
     pytest labs/11 -k naive        (part A)
     pytest labs/11 -k cache        (part B)
     pytest labs/11 -k absorb       (part C)
The oracle here is a short float64 MLA written from the handout's pseudocode (``_reference``).
"""
import math

import pytest
import torch

from harness.toolkit import AllocationTracker, assert_close, expect_raises

CFG = dict(d_model=32, n_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)


def _layer(impl, seed=0, **over):
    torch.manual_seed(seed)
    cfg = impl.MLAConfig(**{**CFG, **over})
    layer = impl.MultiHeadLatentAttention(cfg)
    with torch.no_grad():  # weights large enough that the scores are O(1), not near-uniform
        for p in layer.parameters():
            if p.dim() == 2:
                p.normal_(0, p.shape[1] ** -0.5)
    return layer.eval().requires_grad_(False), cfg


def _reference(layer, cfg, x):
    """Float64 MLA of ``x (B, T, d)`` at positions 0..T-1, causal, from the layer's weights."""
    H, r, dn, dr, dv = (cfg.n_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                        cfg.v_head_dim)
    W = {k: v.double() for k, v in layer.state_dict().items()}
    x = x.double()
    B, T, _ = x.shape
    ang = torch.arange(T, dtype=torch.float64)[:, None] * cfg.rope_theta ** (
        -torch.arange(0, dr, 2, dtype=torch.float64) / dr)

    def rope(t):  # interleaved pairs (t[2i], t[2i+1])
        cos, sin = (ang.cos(), ang.sin()) if t.dim() == 3 else (ang.cos()[:, None], ang.sin()[:, None])
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

    q_nope, q_rope = (x @ W["wq.weight"].T).view(B, T, H, dn + dr).split([dn, dr], -1)
    c_kv, k_rope = (x @ W["wkv_a.weight"].T).split([r, dr], -1)
    c_kv = c_kv / torch.sqrt(c_kv.pow(2).mean(-1, keepdim=True) + 1e-6) * W["kv_norm.weight"]
    k_nope, v = (c_kv @ W["wkv_b.weight"].T).view(B, T, H, dn + dv).split([dn, dv], -1)
    s = torch.einsum("bqhd,bkhd->bhqk", q_nope, k_nope) + torch.einsum("bqhd,bkd->bhqk", rope(q_rope), rope(k_rope))
    s = (s / math.sqrt(dn + dr)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("bhqk,bkhv->bqhv", torch.softmax(s, -1), v)
    return o.reshape(B, T, H * dv) @ W["wo.weight"].T


def _x(B, T, seed=1):
    return torch.randn(B, T, CFG["d_model"], generator=torch.Generator().manual_seed(seed))


# --- Part A: MLAConfig and the naive path ----------------------------------------------------

@pytest.mark.part("A")
def test_naive_config_rejects_an_odd_rope_dim(impl):
    impl.MLAConfig(**{**CFG, "qk_rope_head_dim": 6})   # an even one is accepted: only the odd one is refused
    e = expect_raises(ValueError, "MLAConfig(qk_rope_head_dim=5) (RoPE turns pairs)",
                      impl.MLAConfig, **{**CFG, "qk_rope_head_dim": 5})
    assert "qk_rope_head_dim" in str(e), f"the ValueError must name qk_rope_head_dim, got {str(e)!r}"


@pytest.mark.part("A")
def test_naive_matches_the_float64_reference(impl):
    layer, cfg = _layer(impl)
    x = _x(2, 7)
    out = layer(x)
    assert out.dtype == x.dtype and out.shape == x.shape
    assert_close(out, _reference(layer, cfg, x), atol=1e-5, rtol=1e-5, case="B2-T7",
                 what="naive MLA output differs from the float64 reference (layouts, interleaved RoPE on the rope "
                      "parts only, scale 1/sqrt(qk_nope + qk_rope), kv_norm on c_kv, causal mask)")


@pytest.mark.part("A")
def test_naive_with_d_model_not_divisible_by_heads(impl):
    layer, cfg = _layer(impl, d_model=30, n_heads=4)
    x = torch.randn(1, 5, 30, generator=torch.Generator().manual_seed(2))
    assert_close(layer(x), _reference(layer, cfg, x), atol=1e-5, rtol=1e-5, case="d_model=30, n_heads=4",
                 what="naive MLA output differs (d_model need not be divisible by n_heads)")


# --- Part B: the latent cache ----------------------------------------------------------------

@pytest.mark.part("B")
def test_cache_nbytes_is_the_latent_formula(impl):
    cfg = impl.MLAConfig(**CFG)
    cache = impl.MLACache(3, 10, cfg, dtype=torch.bfloat16)
    want = 3 * 10 * (CFG["kv_lora_rank"] + CFG["qk_rope_head_dim"]) * 2
    assert cache.nbytes == want, f"nbytes must be batch_size * max_seq_len * (kv_lora_rank + qk_rope) * itemsize " \
                                 f"= {want}, got {cache.nbytes}"
    assert cache.seq_len == 0


@pytest.mark.part("B")
def test_cache_decoding_equals_the_full_forward(impl):
    layer, cfg = _layer(impl)
    x = _x(2, 9, seed=3)
    cache = impl.MLACache(2, 9, cfg)
    full = layer(x)
    outs = [layer(x[:, :5], cache=cache)] + [layer(x[:, t:t + 1], cache=cache) for t in range(5, 9)]
    assert cache.seq_len == 9
    assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5, case="prefill 5, then 4 single-token steps",
                 what="cached decoding differs from the uncached forward (RoPE positions start at seq_len)")


@pytest.mark.part("B")
def test_cache_multi_token_append_is_bottom_right_causal(impl):
    layer, cfg = _layer(impl)
    x = _x(1, 8, seed=4)
    cache = impl.MLACache(1, 8, cfg)
    layer(x[:, :3], cache=cache)
    chunk = layer(x[:, 3:8], cache=cache)
    assert_close(chunk, layer(x)[:, 3:], atol=1e-5, rtol=1e-5, case="3 cached, then 5 new",
                 what="a 5-token append after 3 cached differs from the uncached forward (is the causal mask "
                      "bottom-right aligned: j <= i + seq_len?)")


@pytest.mark.part("B")
def test_cache_overflow_raises_value_error_naming_max_seq_len(impl):
    layer, cfg = _layer(impl)
    cache = impl.MLACache(1, 4, cfg)
    layer(_x(1, 3), cache=cache)
    e = expect_raises(ValueError, "a forward of 2 tokens into a cache holding 3 of max_seq_len=4",
                      layer, _x(1, 2, seed=5), cache=cache)
    assert "max_seq_len" in str(e), f"the ValueError must name max_seq_len, got {str(e)!r}"
    assert cache.seq_len == 3, "a refused forward must not change seq_len"


# --- Part C: the absorbed path ---------------------------------------------------------------

@pytest.mark.part("C")
def test_absorb_equals_naive(impl):
    layer, cfg = _layer(impl)
    x = _x(2, 6, seed=6)
    assert_close(layer(x, absorb=True), layer(x), atol=1e-5, rtol=1e-5, case="B2-T6, no cache",
                 what="absorb=True differs from the naive path (fold W_UK, the first qk_nope rows of each head of "
                      "wkv_b, into the query; apply W_UV to the attended latent)")


@pytest.mark.part("C")
def test_absorb_decode_step_allocates_no_per_head_keys(impl):
    over = dict(n_heads=8, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    layer, cfg = _layer(impl, **over)
    B, Lk = 2, 200
    x = _x(B, Lk, seed=7)
    cache = impl.MLACache(B, Lk, cfg)
    layer(x[:, :Lk - 1], cache=cache)
    with AllocationTracker() as t:
        step = layer(x[:, Lk - 1:], cache=cache, absorb=True)
    assert_close(step, layer(x)[:, -1:], atol=1e-5, rtol=1e-5, case=f"B{B}, a decode step at Lk={Lk}",
                 what="the absorbed decode step differs from the naive forward")
    limit = B * over["n_heads"] * Lk * min(over["qk_nope_head_dim"], over["v_head_dim"])
    assert t.max_numel < limit, (f"the absorbed decode step allocated {t.largest} ({t.max_numel} elements); a "
                                 f"per-head key or value over the cache is {limit}: attend against the latent")
