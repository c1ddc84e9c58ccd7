"""Unit tests of harness.sandbox.ranks: ranks inside the sandbox, results, errors, deadlocks,
the communication counter. The toy implementation below plays a submission."""
import os
import time

import pytest
import torch

from harness.sandbox import ranks as hd
from harness import impl as _impl
from harness.sandbox import outside

TOY = '''
import os, time
import torch
import torch.distributed as dist
from torch.distributed import all_reduce as saved_all_reduce


def echo(x):
    return {"rank": dist.get_rank(), "W": dist.get_world_size(), "x": x * (dist.get_rank() + 1),
            "backend": dist.get_backend()}


def ring_sum(t):
    r, W = dist.get_rank(), dist.get_world_size()
    buf = torch.empty(1)
    ops = [dist.P2POp(dist.isend, t, (r + 1) % W), dist.P2POp(dist.irecv, buf, (r - 1) % W)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    try:
        dist.all_reduce(t)
    except AssertionError:
        pass  # swallowed, but still recorded
    return buf


def deadlock():
    t = torch.zeros(1)
    dist.send(t, 1 - dist.get_rank())
    dist.recv(t, 1 - dist.get_rank())


def raise_on_rank1():
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    t = torch.zeros(1)
    dist.recv(t, 1)


def exit_rank0():
    if dist.get_rank() == 0:
        os._exit(3)
    time.sleep(30)


def collectives():
    t = torch.ones(6)
    out = torch.empty(6 * dist.get_world_size())
    dist.all_reduce(t)
    dist.all_gather_into_tensor(out, t)  # deprecated name calling all_gather_single: counted once
    return out


def add_(t, v):
    t.add_(v)
    return t


_STASH = {"ar": dist.all_reduce}


def bypasses(t):
    """Collectives the counter must see although they dodge the module attribute."""
    out = []
    for how in ("saved_name", "saved_in_dict", "process_group"):
        try:
            if how == "saved_name":
                saved_all_reduce(t)
            elif how == "saved_in_dict":
                _STASH["ar"](t)
            else:
                dist.distributed_c10d._get_default_group().allreduce([t]).wait()
            out.append(how + " ran")
        except AssertionError:
            out.append(how + " refused")
    return out


def hostname_peer():
    import socket
    try:
        socket.create_connection(("192.0.2.1", 80), timeout=1)
        return "reached"
    except OSError as e:
        return type(e).__name__
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy") / "toy_dist.py"
    path.write_text(TOY)
    mod = _impl.load_module(path)
    yield mod
    hd.shutdown()


def body_call(rk, name, *args):
    return rk.call(getattr(rk.impl, name), *args, forbid_collectives=hd.DATA_COLLECTIVES)


def test_results_in_rank_order_and_group_reused(toy):
    res = hd.run(lambda rk: rk.impl.echo(torch.ones(2)), 3, impl=toy)
    assert [r["rank"] for r in res] == [0, 1, 2] and all(r["W"] == 3 for r in res)
    assert torch.equal(res[2]["x"], torch.full((2,), 3.0)) and res[0]["backend"] == "gloo"
    t0 = time.monotonic()
    hd.run(lambda rk: rk.impl.echo(torch.ones(1)), 3, impl=toy)
    assert time.monotonic() - t0 < 5, "a second run reuses the ranks (only a new process group)"


def test_counter_counts_p2p_and_collectives(toy):
    res = hd.run(lambda rk: rk.call(rk.impl.ring_sum, torch.tensor([float(rk.rank)])), 3, impl=toy)
    for r, c in enumerate(res):
        assert c.out.item() == float((r - 1) % 3)
        assert c.comm["sent_msgs"] == 1 and c.comm["sent_bytes"] == 4 and c.comm["recv_bytes"] == 4
        assert c.comm["collectives"] == {"all_reduce": 1} and c.comm["forbidden"] == []
    assert res.loopback_bytes is None or res.loopback_bytes >= 3 * 4  # the ranks' own network, read outside
    assert (res.tcp_retransmits is None) == (res.loopback_bytes is None) and (res.tcp_retransmits or 0) >= 0


def test_tcp_retransmits_read_from_proc():
    assert isinstance(outside.tcp_retransmits(os.getpid()), int) and outside.tcp_retransmits(0) is None


def test_a_forbidden_collective_fails_the_call_even_when_swallowed(toy):
    with pytest.raises(hd.RankError, match="called all_reduce: the contract forbids collectives"):
        hd.run(lambda rk: body_call(rk, "ring_sum", torch.tensor([float(rk.rank)])), 3, impl=toy)


def test_nested_collectives_counted_once_and_saved_names_are_counted(toy):
    res = hd.run(lambda rk: rk.call(rk.impl.collectives), 2, impl=toy)
    assert res[0].comm["collectives"] == {"all_reduce": 1, "all_gather_into_tensor": 1}


def test_collectives_are_counted_however_they_are_reached(toy):
    res = hd.run(lambda rk: rk.call(rk.impl.bypasses, torch.ones(3)), 2, impl=toy)
    assert res[0].out == ["saved_name ran", "saved_in_dict ran", "process_group ran"]
    assert res[0].comm["collectives"] == {"all_reduce": 3}
    with pytest.raises(hd.RankError, match="called all_reduce"):  # and forbidden however they are reached
        hd.run(lambda rk: rk.call(rk.impl.bypasses, torch.ones(3), forbid_collectives=hd.DATA_COLLECTIVES), 2,
               impl=toy)


def test_in_place_calls_return_args_and_identity(toy):
    def body(rk):
        base = torch.full((3, 4), -7.0)
        return rk.call(rk.impl.add_, hd.View(base, base[:, 1::2]), 1.0)
    res = hd.run(body, 2, impl=toy)
    got = res[0].args[0]
    assert res[0].same == [True, False]
    assert got.shape == (3, 4) and (got[:, 1::2] == -6).all() and (got[:, 0::2] == -7).all()


def test_deadlock_times_out_fast_and_the_next_run_works(toy):
    t0 = time.monotonic()
    with pytest.raises(hd.RankTimeout, match="deadlock") as info:
        hd.run(lambda rk: rk.call(rk.impl.deadlock), 2, impl=toy, timeout=6)
    assert time.monotonic() - t0 < 20
    assert "in send(dst=" in str(info.value), str(info.value)
    res = hd.run(lambda rk: rk.impl.echo(torch.ones(1)), 2, impl=toy)
    assert len(res) == 2


def test_exception_names_rank_and_root_cause_first(toy):
    with pytest.raises(hd.RankError) as info:
        hd.run(lambda rk: rk.call(rk.impl.raise_on_rank1), 2, impl=toy, timeout=15)
    msg = str(info.value)
    assert msg.startswith("rank 1 of 2 raised ValueError: boom on rank 1"), msg


def test_dead_rank_reported(toy):
    with pytest.raises(hd.RankError, match=r"rank 0 of 2 died.*exited with code 3"):
        hd.run(lambda rk: rk.call(rk.impl.exit_rank0), 2, impl=toy, timeout=15)


def test_ranks_reach_only_their_private_loopback(toy):
    from harness.sandbox import isolation
    if not isolation.isolation_prefix():
        pytest.skip("no namespaces on this host")
    res = hd.run(lambda rk: rk.impl.hostname_peer(), 2, impl=toy)
    assert "reached" not in res


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        hd.run(lambda rk: None, 0, impl=None)
