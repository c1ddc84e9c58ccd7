"""Hidden graders for lab 05, Part B (bonus): PagedKVCache.

API as the stub and the handout specify it (the contract only sketches Part B):
``PagedKVCache(num_blocks, block_size, n_layers, n_kv_heads, head_dim, dtype, device)``,
``allocate(seq_id)``, ``free(seq_id)``, ``update(layer_idx, seq_id, k, v) -> (k_all, v_all)``
with ``k, v: (Hkv, T, D)``, ``seq_len(seq_id)``, ``block_table(seq_id)``,
``num_free_blocks``, ``nbytes``. The oracle is the plain concatenation of what each
sequence appended.
"""
from __future__ import annotations

import pytest
import torch

from harness.toolkit import checked, expect_raises, held_bytes, held_storages

N_LAYERS, HKV, D = 2, 2, 6
NO_STORAGE = ("found no tensor storage in the PagedKVCache (searched its attributes, lists, tuples, dicts, helper "
              "objects and module buffers at any depth): it must hold its preallocated block tensors from __init__ "
              "on; the storage and out-of-blocks checks read them")


def storages(obj):
    """{data_ptr: nbytes} of the distinct storages behind every tensor ``obj`` holds (at any depth)."""
    found = held_storages(obj, deep=True)
    assert found, NO_STORAGE
    return found


def raw_bytes(obj):
    found = held_bytes(obj, deep=True)
    assert found, NO_STORAGE
    return found


class Driver:
    """Appends to a PagedKVCache through every layer and keeps the expected prefixes."""

    def __init__(self, cache, gen, prop="the block accounting", dtype=torch.float32, pool=None):
        self.cache, self.gen, self.want, self.prop, self.dtype = cache, gen, {}, prop, dtype
        self.pool = pool  # (block_size, num_blocks): an unexplained out-of-blocks refusal is the waste bug

    def allocate(self, sid):
        self.cache.allocate(sid)
        self.want[sid] = [torch.empty(2, HKV, 0, D) for _ in range(N_LAYERS)]  # (k|v, Hkv, positions, D)

    def free(self, sid):
        self.cache.free(sid)
        del self.want[sid]

    def append(self, sid, T):
        """Append T positions to ``sid`` through every layer. With a ``pool``, an out-of-blocks
        refusal (RuntimeError) the contract's accounting does not explain (ceil(seq_len / block_size) blocks per
        live sequence) is reported as the waste bug."""
        for layer in range(N_LAYERS):
            k = torch.randn(HKV, T, D, generator=self.gen).to(self.dtype)
            v = torch.randn(HKV, T, D, generator=self.gen).to(self.dtype)
            try:
                out = self.cache.update(layer, sid, k, v)
            except RuntimeError as e:
                if self.pool is None:
                    raise
                block_size, num_blocks = self.pool
                lens = {s: w[0].shape[-2] + (T if s == sid and layer == 0 else 0) for s, w in self.want.items()}
                need = sum(-(-n // block_size) for n in lens.values())
                if need > num_blocks:
                    raise
                held = {s: len(self.cache.block_table(s)) for s in self.want}
                raise AssertionError(
                    f"wasted slots >= block_size: appending T={T} to seq {sid!r} (layer {layer}) ran out of blocks "
                    f"({e}) although the live sequences need {need} of num_blocks={num_blocks} (positions: {lens}); "
                    f"they hold {held} blocks of {block_size}; take a block only when a position needs one, once "
                    f"per append, not per layer") from None
            self.want[sid][layer] = torch.cat([self.want[sid][layer], torch.stack([k, v])], dim=-2)
            case = f"seq {sid!r}, layer {layer}, {self.want[sid][layer].shape[-2]} positions"
            checked(tuple(out) if isinstance(out, (tuple, list)) else out,
                    (self.want[sid][layer][0], self.want[sid][layer][1]), atol=0, rtol=0, case=case,
                    what=("paged update's k_all is not the sequence's stored prefix",
                          "paged update's v_all is not the sequence's stored prefix"), prop=self.prop)

    def check_accounting(self, block_size, num_blocks):
        used = []
        for sid in self.want:
            n, table = self.cache.seq_len(sid), self.cache.block_table(sid)
            stored = self.want[sid][0].shape[-2]
            assert n == stored, f"seq_len({sid!r}) is {n}, expected {stored}"
            waste = len(table) * block_size - n
            assert 0 <= waste < block_size, (
                f"wasted slots >= block_size: seq {sid!r} holds {len(table)} blocks of {block_size} for {n} "
                f"positions ({waste} wasted); take a block only when a position needs one")
            used += table
        assert len(used) == len(set(used)), f"two live sequences share a block: tables {used}"
        assert all(0 <= b < num_blocks for b in used), f"block id out of range 0..{num_blocks - 1}: {used}"
        assert self.cache.num_free_blocks == num_blocks - len(used), (
            f"num_free_blocks is {self.cache.num_free_blocks}, expected {num_blocks} - {len(used)} in use")


def new(impl, num_blocks, block_size, dtype=torch.float32):
    return impl.PagedKVCache(num_blocks, block_size, N_LAYERS, HKV, D, dtype=dtype, device="cpu")


@pytest.mark.part("B")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_paged_nbytes_and_storage_preallocated(impl, gen, dtype):
    cache = new(impl, 7, 5, dtype)
    want = 2 * N_LAYERS * 7 * HKV * 5 * D * torch.empty(0, dtype=dtype).element_size()
    nbytes, held, free = cache.nbytes, sum(storages(cache).values()), cache.num_free_blocks  # right after __init__
    drv = Driver(cache, gen, prop="nbytes and the preallocated storage", dtype=dtype)
    drv.allocate("s")
    drv.append("s", 3)
    drv.append("s", 6)   # into a second block: the prefix is gathered from two
    assert nbytes == want, (f"PagedKVCache.nbytes is {nbytes}, the formula 2*n_layers*num_blocks*"
                            f"n_kv_heads*block_size*head_dim*element_size gives {want}")
    assert want <= held <= want + 4096, f"block storage not preallocated: {held} bytes held, expected {want}"
    assert free == 7, f"a new PagedKVCache must have num_free_blocks = num_blocks = 7, got {free}"


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_paged_update_returns_each_sequence_prefix(impl, gen):
    block_size, num_blocks = 5, 12
    cache = new(impl, num_blocks, block_size)
    ptrs = set(storages(cache))
    drv = Driver(cache, gen, pool=(block_size, num_blocks))
    for sid in ("a", 7, "c"):
        drv.allocate(sid)
    for sid, T in (("a", 3), (7, 6), ("a", 4), ("c", 1), (7, 1), ("a", 5), ("c", 9), (7, 3)):
        drv.append(sid, T)  # interleaved: tables are not contiguous
    assert set(storages(cache)) == ptrs, "the block storage was reallocated by update"


@pytest.mark.part("B")
@pytest.mark.points(2)
def test_paged_wasted_slots_below_block_size(impl, gen):
    block_size, num_blocks = 4, 20
    cache = new(impl, num_blocks, block_size)
    drv = Driver(cache, gen)
    drv.allocate(0)
    drv.check_accounting(block_size, num_blocks)
    drv.allocate(1)
    for sid, T in ((0, 1), (1, 4), (0, 3), (1, 1), (0, 5), (1, 7), (0, 4)):
        drv.append(sid, T)
        drv.check_accounting(block_size, num_blocks)


@pytest.mark.part("B")
def test_paged_free_returns_blocks_for_reuse(impl, gen):
    block_size, num_blocks = 3, 6
    cache = new(impl, num_blocks, block_size)
    drv = Driver(cache, gen, pool=(block_size, num_blocks))
    drv.allocate("x")
    drv.allocate("y")
    drv.append("x", 8)   # 3 blocks
    drv.append("y", 7)   # 3 blocks: the pool is empty
    drv.check_accounting(block_size, num_blocks)
    freed = set(cache.block_table("x"))
    drv.free("x")
    assert cache.num_free_blocks == 3, f"free() returned {cache.num_free_blocks} blocks to the pool, expected 3"
    expect_raises(ValueError, "seq_len('x') after free('x') (a freed id is not live)", cache.seq_len, "x")
    drv.allocate("z")
    drv.append("z", 9)   # needs exactly the 3 freed blocks
    assert set(cache.block_table("z")) == freed, "a new sequence did not reuse the freed blocks"
    drv.append("y", 2)   # y's last block still has 2 free slots
    drv.check_accounting(block_size, num_blocks)
    drv.allocate("x")    # a freed id may be allocated again
    drv.check_accounting(block_size, num_blocks)


@pytest.mark.part("B")
def test_paged_out_of_blocks_raises_and_changes_nothing(impl, gen):
    block_size, num_blocks = 4, 5
    cache = new(impl, num_blocks, block_size)
    drv = Driver(cache, gen, pool=(block_size, num_blocks))
    drv.allocate("a")
    drv.allocate("b")
    drv.append("a", 10)  # 3 blocks
    drv.append("b", 5)   # 2 blocks: pool empty, a has 2 spare slots, b has 3
    before, tables = raw_bytes(cache), {s: cache.block_table(s) for s in ("a", "b")}
    k = torch.randn(HKV, 3, D, generator=gen)
    case = "3 new positions for seq 'a' (10 stored, 2 spare slots) with no free block"
    err = expect_raises(RuntimeError, f"an out-of-blocks update ({case})", cache.update, 0, "a", k, k.clone())
    assert "num_blocks" in str(err), f"the out-of-blocks error must name num_blocks ({case}), got: {err}"
    changed = [i for i, (x, y) in enumerate(zip(before, raw_bytes(cache))) if not torch.equal(x, y)]
    assert not changed, f"a refused update wrote block storage ({case}): storage(s) {changed} changed"
    after = {s: cache.block_table(s) for s in ("a", "b")}
    assert after == tables, f"a refused update changed a block table ({case}): {tables} before, {after} after"
    assert (cache.seq_len("a"), cache.num_free_blocks) == (10, 0), (
        f"a refused update changed seq_len('a') or num_free_blocks ({case}): {cache.seq_len('a')} and "
        f"{cache.num_free_blocks}, expected 10 and 0")
    drv.append("b", 3)  # filling b's last block exactly is still allowed
    drv.check_accounting(block_size, num_blocks)


@pytest.mark.part("B")
def test_paged_bad_arguments_raise(impl, gen):
    """Each refusal next to its valid neighbour: seq 1 is allocated and appended through every
    layer (its prefix checked) before the refused calls, appended again and freed after them."""
    cache = new(impl, 4, 4, torch.float16)
    drv = Driver(cache, gen, prop="the bad-argument refusals", dtype=torch.float16)
    drv.allocate(1)
    drv.append(1, 2)
    k = torch.randn(HKV, 2, D, generator=gen).half()
    for exc, case, call in (
            (ValueError, "allocate(1) while seq 1 is live", lambda: cache.allocate(1)),
            (ValueError, "free(2), never allocated", lambda: cache.free(2)),
            (ValueError, "update(0, 2, k, v) for seq 2, never allocated", lambda: cache.update(0, 2, k, k)),
            (ValueError, "update(0, 1, k, v) with 1 head for n_kv_heads=2", lambda: cache.update(0, 1, k[:1], k[:1])),
            (ValueError, "update(0, 1, k, v) with 4-d k, v (Hkv, T, D expected)",
             lambda: cache.update(0, 1, k[None], k[None])),
            (TypeError, "update(0, 1, k, v) in float32 for a float16 cache",
             lambda: cache.update(0, 1, k.float(), k.float()))):
        expect_raises(exc, case, call)
    drv.append(1, 3)  # the refused calls changed nothing: the prefix is still what was appended
    drv.free(1)
