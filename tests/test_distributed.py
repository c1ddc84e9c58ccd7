"""Unit tests of harness.distributed: results, errors, deadlocks, the communication counter."""
import time

import pytest
import torch
import torch.distributed as dist

from harness import distributed as hd


def body_echo(ctx, x):
    return {"rank": ctx.rank, "W": ctx.world_size, "x": x * (ctx.rank + 1), "backend": ctx.backend}


def body_ring_sum(ctx):
    t = torch.tensor([float(ctx.rank)])
    buf = torch.empty(1)
    with ctx.count_comm(forbid=hd.DATA_COLLECTIVES) as comm:
        right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
        ops = [dist.P2POp(dist.isend, t, right), dist.P2POp(dist.irecv, buf, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        try:
            dist.all_reduce(t)
        except AssertionError:
            pass  # swallowed, but still recorded
    return {"got": buf, "comm": comm.report()}


def body_deadlock(ctx):
    t = torch.zeros(1)
    with ctx.count_comm():
        dist.send(t, 1 - ctx.rank)
        dist.recv(t, 1 - ctx.rank)


def body_raise_on_rank1(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    t = torch.zeros(1)
    dist.recv(t, 1)


def body_exit(ctx):
    import os
    if ctx.rank == 0:
        os._exit(3)
    time.sleep(30)


def body_collective_count(ctx):
    t = torch.ones(6)
    out = torch.empty(6 * ctx.world_size)
    with ctx.count_comm() as comm:
        dist.all_reduce(t)
        dist.all_gather_into_tensor(out, t)  # deprecated name calling all_gather_single: counted once
    return comm.report()


def test_results_in_rank_order_and_pool_reused():
    assert [r["x"] for r in hd.run(body_echo, 3, 2)] == [2, 4, 6]
    t0 = time.monotonic()
    res = hd.run(body_echo, 3, torch.ones(2))
    assert time.monotonic() - t0 < 10
    assert torch.equal(res[2]["x"], torch.full((2,), 3.0)) and res[0]["backend"] == "gloo"


def test_counter_counts_p2p_and_records_forbidden_collectives():
    res = hd.run(body_ring_sum, 3)
    for r, got in enumerate(res):
        assert got["got"].item() == float((r - 1) % 3)
        c = got["comm"]
        assert (c["sent_msgs"], c["sent_bytes"], c["recv_msgs"]) == (1, 4, 1)
        assert c["forbidden"] == ["all_reduce"]


def test_nested_collectives_counted_once():
    rep = hd.run(body_collective_count, 2)[0]
    assert rep["collectives"] == {"all_reduce": 1, "all_gather_into_tensor": 1}
    assert rep["collective_elems"] == 6 + 12


def test_deadlock_times_out_and_the_next_run_works():
    t0 = time.monotonic()
    with pytest.raises(hd.RankTimeout, match="deadlock"):
        hd.run(body_deadlock, 2, timeout=8)
    assert time.monotonic() - t0 < 20
    assert [r["rank"] for r in hd.run(body_echo, 2, 1)] == [0, 1]


def test_exception_names_rank_and_root_cause_first():
    with pytest.raises(hd.RankError) as e:
        hd.run(body_raise_on_rank1, 2, timeout=20)
    msg = str(e.value)
    assert msg.startswith("rank 1 of 2 raised ValueError: boom on rank 1")
    assert "body_raise_on_rank1" in msg  # the traceback is there
    assert hd.run(body_echo, 2, 1)[1]["x"] == 2


def test_dead_rank_reported():
    with pytest.raises(hd.RankError, match="rank 0 of 2 died"):
        hd.run(body_exit, 2, timeout=20)
    assert hd.run(body_echo, 2, 1)[0]["rank"] == 0


def test_body_must_be_module_level():
    with pytest.raises(ValueError, match="module-level"):
        hd.run(lambda ctx: None, 1)
