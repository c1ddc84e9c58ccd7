"""Hidden graders for lab 13, Part A: the BlockManager.

The oracle is the graders' own ``sv.RefBlockManager`` (the contract's rules, keyed by exact
token prefixes). Each test grades one rule on operations where the other rules cannot
change what it reads: the free-queue test never caches; the cache tests read what the
submission's own tables hold (which block of a table is cached or hit), never block ids
that another rule chose. Token lists come from the run seed.
"""
from __future__ import annotations

import pytest
import torch

from harness.toolkit import expect_raises

V = 64


def _tokens(gen, n):
    return torch.randint(0, V, (n,), generator=gen).tolist()


class Both:
    """The submission's BlockManager and the graders' model, driven alike; full-state checks."""

    def __init__(self, sv, impl, nb, B):
        self.sv, self.nb, self.B = sv, nb, B
        self.bulk = sv.bulk(impl)
        self.bm = sv.owned_block_manager(impl, nb, B)
        self.m = sv.Methods(self.bm)
        self.ref = sv.RefBlockManager(nb, B)
        self.ops = []

    def do(self, op, *args):
        self.ops.append(f"{op}({', '.join(repr(a) if not isinstance(a, list) else f'<{len(a)} tokens>' for a in args)})")
        want = getattr(self.ref, op)(*args)
        got = getattr(self.m, op)(*args)
        return got, want

    def state(self):
        sids = list(self.ref.tables)
        return self.sv.bm_state(self.bulk, self.m, sids, self.nb), self.ref.state(sids), sids

    def where(self):
        return f"num_blocks={self.nb}, block_size={self.B}, after {' -> '.join(self.ops[-6:])}"


# --- the free queue -------------------------------------------------------------------------------

@pytest.mark.part("A")
@pytest.mark.points(3)
def test_fresh_blocks_come_from_the_head_and_freed_blocks_join_the_tail_last_first(impl, gen, sv):
    """No prefix caching here, no append_slot (graded apart). A new table takes fresh blocks one by one
    from the head of the free queue; ``free`` decrements the table's blocks in reverse order, each
    reaching 0 joining the tail. After every operation: the free queue, every reference count,
    every table and slot count."""
    b = Both(sv, impl, 11, 3)
    ops = [("allocate", "a", 7), ("allocate", "b", 4), ("allocate", "c", 5), ("free", "a"), ("allocate", "d", 8),
           ("free", "c"), ("allocate", "e", 10), ("free", "b"), ("allocate", "f", 3), ("free", "d"), ("free", "e"),
           ("free", "f")]
    for op in ops:
        args = (op[1], _tokens(gen, op[2])) if op[0] == "allocate" else (op[1],)
        got, want = b.do(op[0], *args)
        if want is not None and got != want:
            raise AssertionError(f"{op[0]}{args[:1]} returned {got!r}, expected {want!r} ({b.where()})")
        mine, ref, sids = b.state()
        if mine["tables"] != ref["tables"] and op[0] == "allocate":
            tail = "fresh blocks come from the head of the free queue" \
                if any(t and t[-1] != r[-1] for t, r in zip(mine["tables"], ref["tables"])) else "the table is wrong"
            raise AssertionError(f"{tail}: tables {dict(zip(sids, mine['tables']))}, expected "
                                 f"{dict(zip(sids, ref['tables']))} ({b.where()})")
        if mine["free"] != ref["free"]:
            hint = ""
            if op[0] == "free":
                hint = ("free must append the table's blocks in REVERSE order (last block first, the least likely to "
                        "be shared; vLLM's free_blocks(reversed(blocks))): ")
            raise AssertionError(f"{hint}the free queue is {sv.short(mine['free'], 16)}, expected "
                                 f"{sv.short(ref['free'], 16)} ({b.where()})")
        for key in ("ref", "tables", "slots"):
            assert mine[key] == ref[key], f"{key} is {mine[key]}, expected {ref[key]} ({b.where()})"
        assert b.bm.num_free_blocks == len(ref["free"]), \
            f"num_free_blocks is {b.bm.num_free_blocks}, expected {len(ref['free'])} ({b.where()})"


@pytest.mark.part("A")
@pytest.mark.points(3)
@pytest.mark.parametrize("B", [4, 5])
def test_append_slot_reserves_the_next_position(impl, gen, sv, B):
    """``append_slot`` reserves position ``p = num_slots``: a fresh block only when ``p % B == 0``;
    it returns ``table[p // B] * B + p % B`` (read from the submission's own table), and the table
    holds ``ceil(num_slots / B)`` blocks. When a block is needed and none is free, ``can_append``
    is False and ``append_slot`` raises NoFreeBlocksError, changing nothing."""
    nb = 5
    bm = sv.owned_block_manager(impl, nb, B)
    m = sv.Methods(bm)
    m.allocate("x", _tokens(gen, B + 2))
    m.allocate("y", _tokens(gen, 2 * B))              # 4 blocks held, 1 free
    for sid, steps in (("x", 3 * B - 2), ("y", B)):
        for _ in range(steps):
            p = int(m.num_slots(sid))
            if p % B == 0 and not bool(m.can_append(sid)):
                break
            slot = int(m.append_slot(sid))
            table = list(m.block_table(sid))
            want = table[p // B] * B + p % B if p // B < len(table) else None
            if slot != want:
                last = " (the slot of a full block's last position is off by one block)" if p % B == B - 1 else ""
                raise AssertionError(f"append_slot returned slot {slot} for position {p} of seq {sid!r}{last}; its "
                                     f"table {table} gives table[{p} // {B}] * {B} + {p % B} = {want} "
                                     f"(block_size={B})")
            assert len(table) == sv.cdiv(p + 1, B), \
                (f"seq {sid!r} holds {len(table)} blocks for {p + 1} slots (block_size={B}), expected "
                 f"{sv.cdiv(p + 1, B)}: take a fresh block only when p % B == 0 (the slot of a full block's last "
                 f"position is in that block)")
    # the pool is now empty; y sits at a block boundary
    p = int(m.num_slots("y"))
    assert p % B == 0 and bm.num_free_blocks == 0, f"grader defect: y at {p}, {bm.num_free_blocks} free"
    assert not bool(m.can_append("y")), f"can_append('y') is True at position {p} (block_size={B}) with no free block"
    before = (list(m.block_table("y")), list(m.free_block_ids()))
    e = expect_raises(RuntimeError, f"append_slot('y') at position {p} with no free block", m.append_slot, "y")
    assert sv.is_no_free(e), f"append_slot with no free block must raise NoFreeBlocksError, got {type(e).__name__}: {e}"
    after = (list(m.block_table("y")), list(m.free_block_ids()), int(m.num_slots("y")))
    assert after == (*before, p), f"a refused append_slot changed the table, the queue or num_slots: {after}"


# --- the prefix cache ------------------------------------------------------------------------------

@pytest.mark.part("A")
@pytest.mark.points(2)
def test_a_prefix_key_covers_every_earlier_token(impl, gen, sv):
    """The key of block i identifies all the tokens ``[0, (i+1)*B)`` (a chained hash), so a block
    holding the same B tokens at another position, or after other tokens, is no hit: a cached
    ``X0 X1 X2 .`` gives no hit to ``X1 X2 ..`` and one block to ``X0 X2 ..``."""
    B = 4
    m = sv.Methods(sv.owned_block_manager(impl, 16, B))
    X0, X1, X2 = (_tokens(gen, B) for _ in range(3))
    a = X0 + X1 + X2 + _tokens(gen, 1)
    m.allocate("a", a)
    m.cache_full_blocks("a", a)
    held = list(m.block_table("a"))
    for label, t, want in (("X1 X2 + 2 tokens (a's blocks 1 and 2 moved to the front)", X1 + X2 + _tokens(gen, 2), 0),
                           ("X0 X2 + 3 tokens (a's block 2 after X0)", X0 + X2 + _tokens(gen, 3), B)):
        got = int(m.cached_prefix_len(t))
        if got != want:
            raise AssertionError(f"chain the prefix cache keys: cached_prefix_len of {label} is {got}, expected "
                                 f"{want}: a block's key must cover every earlier token (key_i = hash((key_(i-1), "
                                 f"block i's tokens))), not only its own B tokens (block_size={B}, a = X0 X1 X2 + 1 "
                                 f"token cached in blocks {held[:3]})")
    got = int(m.allocate("b", X1 + X2 + _tokens(gen, 2)))
    table = list(m.block_table("b"))
    assert got == 0 and not set(table) & set(held), \
        f"chain the prefix cache keys: allocate('b', X1 X2 + 2) returned {got} and table {table}, sharing a's blocks"


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_only_full_blocks_are_cached(impl, gen, sv):
    """``cache_full_blocks`` offers only the full blocks ``i < len // B``: a partial last block is
    never cached (its tokens are still growing), and becomes cacheable once full."""
    B = 4
    m = sv.Methods(sv.owned_block_manager(impl, 12, B))
    t = _tokens(gen, 10)
    m.allocate("a", t)
    m.cache_full_blocks("a", t)
    table = list(m.block_table("a"))
    got = [bool(m.is_cached(x)) for x in table]
    if got != [True, True, False]:
        what = "a partial block was cached" if got[2] else "a full block was not cached"
        raise AssertionError(f"{what}: after cache_full_blocks of 10 tokens (block_size={B}) is_cached of the table "
                             f"{table} is {got}, expected [True, True, False]: only blocks i < len // B are offered")
    m.append_slot("a")
    m.append_slot("a")
    t2 = t + _tokens(gen, 2)
    m.cache_full_blocks("a", t2)
    got = [bool(m.is_cached(x)) for x in table]
    assert got == [True, True, True], \
        f"block 2 is full after 12 tokens and must be cached then: is_cached of {table} is {got}"
    hit = int(m.cached_prefix_len(t2 + _tokens(gen, 1)))
    assert hit == 12, f"cached_prefix_len of the 12 cached tokens + 1 is {hit}, expected 12"


@pytest.mark.part("A")
@pytest.mark.points(3)
def test_a_hit_on_a_free_block_leaves_the_free_queue(impl, gen, sv):
    """A freed sequence's cached blocks stay cached in the free queue; a later hit on one takes it
    out of the queue wherever it is (count 1), so no fresh allocation can hand it out again: the
    queue holds exactly the blocks whose count is 0, and a block sits in two tables only as a hit."""
    B = 4
    nb = 7
    bm = sv.owned_block_manager(impl, nb, B)
    m = sv.Methods(bm)
    a = _tokens(gen, 9)
    m.allocate("a", a)
    m.cache_full_blocks("a", a)
    cached = list(m.block_table("a"))[:2]
    m.free("a")
    got = int(m.allocate("b", a[:8] + _tokens(gen, 3)))
    table = list(m.block_table("b"))
    queue = list(m.free_block_ids())
    assert got == 8 and table[:2] == cached, \
        f"allocate of a's 8 cached tokens + 3 returned {got} with table {table}; expected 8 and {cached} first"
    left = [x for x in cached if x in queue]
    if left or bm.num_free_blocks != nb - 3:
        raise AssertionError(f"a cache hit left in the free queue: seq b hit blocks {cached} (count 0, in the queue) "
                             f"and holds them now, but the queue is {queue} (num_free_blocks={bm.num_free_blocks}, "
                             f"expected {nb - 3}); remove a hit block from the queue wherever it is")
    m.allocate("c", _tokens(gen, 4 * B))              # every free block
    both = set(table) & set(m.block_table("c"))
    assert not both, f"a cache hit left in the free queue: blocks {sorted(both)} were handed out fresh while b holds them"
    refs = [int(m.ref_count(x)) for x in cached]
    assert refs == [1, 1], f"ref_count of b's hit blocks {cached} is {refs}, expected [1, 1]"


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_a_block_taken_fresh_is_evicted(impl, gen, sv):
    """A cached block in the free queue stays cached until it is taken fresh from the head: then its
    entry is removed (evicted), so its old prefix is no hit any more."""
    B, nb = 4, 6
    m = sv.Methods(sv.owned_block_manager(impl, nb, B))
    a = _tokens(gen, 9)
    m.allocate("a", a)
    m.cache_full_blocks("a", a)
    m.free("a")
    assert int(m.cached_prefix_len(a)) == 8, "a freed sequence's full blocks stay cached until evicted"
    m.allocate("big", _tokens(gen, nb * B))           # takes every block fresh: evicts every entry
    got = [bool(m.is_cached(x)) for x in range(nb)]
    hit = int(m.cached_prefix_len(a))
    if any(got) or hit:
        raise AssertionError(f"an evicted block kept its cache entry: after a sequence took all {nb} blocks fresh, "
                             f"is_cached is {got} and cached_prefix_len of a's tokens is {hit}; taking a cached block "
                             f"fresh must remove its entry (a stale entry points at overwritten K/V)")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_the_first_block_offered_for_a_prefix_keeps_the_entry(impl, gen, sv):
    """Two sequences computing the same prefix in one step hold equal blocks; the first offered to
    the cache becomes the entry, the other stays uncached (vLLM V1 keeps both blocks; nano-vllm
    lets the last one win): a later hit gets the first sequence's blocks."""
    B = 4
    m = sv.Methods(sv.owned_block_manager(impl, 12, B))
    t = _tokens(gen, 9)
    m.allocate("first", t)
    m.allocate("second", list(t))
    m.cache_full_blocks("first", t)
    m.cache_full_blocks("second", t)
    f, s = list(m.block_table("first")), list(m.block_table("second"))
    got = ([bool(m.is_cached(x)) for x in f[:2]], [bool(m.is_cached(x)) for x in s[:2]])
    m.allocate("third", t[:8] + _tokens(gen, 2))
    third = list(m.block_table("third"))
    if got != ([True, True], [False, False]) or third[:2] != f[:2]:
        raise AssertionError(f"the first block offered for a prefix must keep the entry: is_cached of first's blocks "
                             f"{f[:2]} and second's {s[:2]} is {got}, expected [True, True] and [False, False]; a "
                             f"third sequence with the prefix got {third[:2]}, expected first's {f[:2]}")


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_hits_leave_the_last_token_to_compute(impl, gen, sv):
    """A token list of n tokens hits at most ``(n - 1) // B`` blocks: its last token is always
    computed (its logits are needed), even when every block is cached."""
    B = 4
    m = sv.Methods(sv.owned_block_manager(impl, 12, B))
    t = _tokens(gen, 12)
    m.allocate("a", t)
    m.cache_full_blocks("a", t)
    for n in (12, 9):
        got = int(m.cached_prefix_len(t[:n]))
        want = (n - 1) // B * B
        if got != want:
            raise AssertionError(f"hits must leave at least the last token to compute: cached_prefix_len of {n} fully "
                                 f"cached tokens is {got}, expected {want} = ((n - 1) // B) * B (block_size={B})")
    got = int(m.allocate("b", list(t)))
    table = list(m.block_table("b"))
    assert got == 8 and len(table) == 3, \
        f"allocate of 12 fully cached tokens returned {got} with {len(table)} blocks; expected 8 and 3 (2 hits + 1 fresh)"


@pytest.mark.part("A")
@pytest.mark.points(2)
def test_can_allocate_counts_a_hit_on_a_free_block_as_a_free_block(impl, gen, sv):
    """``can_allocate(t)``: ``ceil(n / B) - (hits whose count is > 0) <= num_free_blocks``. A hit on a
    block in the free queue still takes a free block; a hit on a block in use does not."""
    B = 4
    a = _tokens(gen, 9)                                  # blocks 0 and 1 full (cached), block 2 partial
    b = a[:8] + _tokens(gen, 5)                          # 4 blocks, the first 2 hits on a's cached blocks
    for nb, keep, label in ((3, False, "a freed: its 3 blocks are the free queue, 2 of them cached hits; 4 free "
                                       "blocks needed, 3 free"),
                            (5, True, "a running: its 2 cached blocks in use; 2 free blocks needed, 2 free")):
        m = sv.Methods(sv.owned_block_manager(impl, nb, B))
        ref = sv.RefBlockManager(nb, B)
        for op, *args in (("allocate", "a", a), ("cache_full_blocks", "a", a)) + (() if keep else (("free", "a"),)):
            getattr(m, op)(*args)
            getattr(ref, op)(*args)
        got, want = bool(m.can_allocate(b)), ref.can_allocate(b)
        if got != want:
            raise AssertionError(f"can_allocate must count a hit on a free block as a free block it uses, and a hit "
                                 f"on a block in use as none: can_allocate(13 tokens, 8 of them cached) is {got}, "
                                 f"expected {want} with {label} (num_blocks={nb}, block_size={B})")
    assert int(m.allocate("b", b)) == 8, "allocate of b (8 cached tokens in use) must return 8"


# --- refusals, after their valid neighbours ------------------------------------------------------

@pytest.mark.part("A")
def test_block_manager_refuses_bad_sizes_and_unknown_ids(impl, gen, sv):
    """``BlockManager(num_blocks, block_size)``: ints >= 1 (valid: a 3-block pool's queue is [0, 1, 2]),
    else ValueError naming the argument; ValueError naming the id for an unknown ``seq_id`` (every
    per-sequence method) and for a block id outside ``[0, num_blocks)``; ``allocate`` of an empty
    list or of a seq_id that has blocks, and ``cache_full_blocks`` past ``num_slots``: ValueError."""
    bm = sv.owned_block_manager(impl, 3, 2)
    m = sv.Methods(bm)
    assert list(m.free_block_ids()) == [0, 1, 2] and bm.num_free_blocks == 3 and bm.block_size == 2, \
        "BlockManager(3, 2): free queue [0, 1, 2], num_free_blocks 3, block_size 2"
    for args, name in (((0, 4), "num_blocks"), ((4, 0), "block_size"), ((-2, 4), "num_blocks")):
        e = expect_raises(ValueError, f"BlockManager{args}", impl.BlockManager, *args)
        assert name in str(e), f"BlockManager{args} must name {name}: {e}"
    t = _tokens(gen, 3)
    assert int(m.allocate(5, t)) == 0
    table = list(m.block_table(5))
    assert len(table) == 2, f"3 tokens in blocks of 2 need 2 blocks, seq 5 holds {table}"
    cases = [("allocate(5, ...) while seq 5 has blocks", m.allocate, (5, t)), ("allocate(6, [])", m.allocate, (6, [])),
             ("cache_full_blocks(5, 4 tokens) with 3 slots", m.cache_full_blocks, (5, t + t[:1]))]
    for meth in ("block_table", "num_slots", "free", "append_slot", "can_append"):
        cases.append((f"{meth}(77) for an unknown seq_id", getattr(m, meth), (77,)))
    cases.append(("cache_full_blocks(77, ...) for an unknown seq_id", m.cache_full_blocks, (77, t)))
    for label, fn, args in cases:
        e = expect_raises(ValueError, label, fn, *args)
        if "unknown" in label:
            assert "77" in str(e), f"{label}: the ValueError must name the id 77: {e}"
    for b in (-1, 3):
        expect_raises(ValueError, f"ref_count({b}) outside [0, 3)", m.ref_count, b)
        expect_raises(ValueError, f"is_cached({b}) outside [0, 3)", m.is_cached, b)
    assert list(m.block_table(5)) == table and int(m.num_slots(5)) == 3, "a refused call changed seq 5"


@pytest.mark.part("A")
def test_allocate_without_enough_free_blocks_raises_and_changes_nothing(impl, gen, sv):
    """``allocate`` when ``can_allocate`` is False raises NoFreeBlocksError (the module's) and changes
    nothing; the same tokens fit once blocks are freed (valid neighbour)."""
    B = 3
    m = sv.Methods(sv.owned_block_manager(impl, 5, B))
    m.allocate("a", _tokens(gen, 7))                   # 3 blocks
    t = _tokens(gen, 8)                                # 3 blocks > 2 free
    before = (list(m.free_block_ids()), list(m.block_table("a")))
    assert not bool(m.can_allocate(t)), "can_allocate of 3 blocks with 2 free must be False"
    e = expect_raises(RuntimeError, "allocate of 3 blocks with 2 free", m.allocate, "b", t)
    assert sv.is_no_free(e), f"allocate with too few free blocks must raise NoFreeBlocksError, got {type(e).__name__}: {e}"
    after = (list(m.free_block_ids()), list(m.block_table("a")))
    assert after == before, f"a refused allocate changed the pool: {after}, before {before}"
    expect_raises(ValueError, "block_table('b') after a refused allocate (b has no blocks)", m.block_table, "b")
    m.free("a")
    assert int(m.allocate("b", t)) == 0 and len(list(m.block_table("b"))) == 3
