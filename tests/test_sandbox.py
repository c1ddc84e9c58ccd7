"""harness.sandbox and harness.worker on their own: the wire format, the proxies, the
helpers in both modes, isolation, and recovery from crashes and hangs."""
from __future__ import annotations

import os
import socket
import textwrap
from pathlib import Path

import pytest
import torch

from harness.sandbox import calls, isolation, wire, zygote
from harness.sandbox import worker as sandbox
from harness.sandbox.calls import gradcheck, is_instance, measure, resident_bytes, restart, vjp
from harness.sandbox.wire import WireError, dumps, loads
from harness.sandbox.worker import RemoteObject, SandboxError, WorkerCrashed, WorkerTimeout

TOY = textwrap.dedent('''
    import os, socket, time
    import torch
    import torch.nn as nn

    SECRET_LOOKUP = {}

    def add(x, y=1):
        return x + y

    def scale_(x):
        x.mul_(2)
        return x

    def fail(kind):
        if kind == "value":
            raise ValueError("bad x=3")
        if kind == "exit":
            os._exit(0)
        if kind == "sysexit":
            raise SystemExit(0)
        if kind == "sleep":
            time.sleep(1000)

    def env():
        return dict(os.environ)

    def whoami():
        return os.getuid()

    def can_read(path):
        try:
            return len(os.listdir(path)) >= 0 and bool(os.listdir(path)) or open(path).read(1) != None
        except OSError:
            return False

    def connect(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return True
        except OSError:
            return False

    class Liar(torch.Tensor):
        pass

    def subclass(x):
        return x.as_subclass(Liar)

    def big(n):
        return torch.ones(n, dtype=torch.uint8).sum()

    class Counter(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.lin = nn.Linear(d, d)
            self.n = 0

        def forward(self, x):
            self.n += 1
            return self.lin(x)

        def me(self):
            return self

    def sdpa_user(q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    def square(x):
        return x * x

    _SAVED_SDPA_OP = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default  # saved at import
    KEPT = {}

    def sdpa_by_op(q):
        return _SAVED_SDPA_OP(q, q, q)[0]

    def blind_repeat(x, n):
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes():
            big = x.repeat(n, 1)
        return big.sum(0)

    def repeat(x, n):
        return x.repeat(n, 1).sum(0)

    def keep(n):
        KEPT["x"] = torch.ones(n)

    def memo(x):
        KEPT.setdefault("memo", x + 1)
        return KEPT["memo"]

    def huge():
        return torch.ones(128 << 20)  # 512 MiB for a request of a few bytes

    def patch_tracker():
        import harness.alloc
        harness.alloc.AllocationTracker._record = lambda self, name, t: None
''')


# --- wire format -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    torch.randn(3, 4), torch.randn(4, 6)[:, ::2], torch.randn(5, 3).t(), torch.tensor(2.5),
    torch.empty(0, 3), torch.tensor([True, False]), torch.randn(3).to(torch.bfloat16),
    torch.arange(6, dtype=torch.int64).view(2, 3).expand(4, 2, 3), torch.randn(2, 2).half(),
], ids=["plain", "strided", "transposed", "0-dim", "empty", "bool", "bf16", "expanded", "fp16"])
def test_tensors_round_trip_with_values_and_strides(value):
    got = loads(dumps(value))
    assert type(got) is torch.Tensor and got.dtype == value.dtype and got.shape == value.shape
    assert got.stride() == value.stride() or value.numel() == 0
    assert torch.equal(got, value)


def test_plain_values_round_trip():
    value = {"a": [1, 2.5, float("nan"), float("-inf"), None, True, "s"], 3: (torch.float16, torch.device("cpu")),
             "big": 2 ** 80, "slice": slice(1, None, 2)}
    got = loads(dumps(value))
    assert got["a"][0] == 1 and got["a"][1] == 2.5 and got["a"][2] != got["a"][2] and got["a"][3] == float("-inf")
    assert got[3] == (torch.float16, torch.device("cpu")) and got["big"] == 2 ** 80 and got["slice"] == slice(1, None, 2)


def test_objects_without_a_wire_form_are_refused():
    with pytest.raises(wire.NotTransferable):
        dumps(lambda: 0)
    with pytest.raises(wire.NotTransferable):
        dumps(torch.randn(2).as_subclass(type("Sub", (torch.Tensor,), {})))


@pytest.mark.parametrize("header", [
    {"t": "tensor", "dtype": "float32", "shape": [4], "stride": [1], "buf": 0},      # 8 bytes for 16
    {"t": "tensor", "dtype": "object", "shape": [1], "stride": [1], "buf": 0},
    {"t": "tensor", "dtype": "float32", "shape": [-1], "stride": [1], "buf": 0},
    {"t": "pickle", "v": "gASV"},
])
def test_malformed_frames_raise_wire_error(header):
    with pytest.raises(WireError):
        wire.decode(header, [b"\0" * 8], lambda t: None)


# --- a worker on a toy module ------------------------------------------------------------------

@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    path = d / "toy.py"
    path.write_text(TOY)
    hidden = d / "hidden"
    hidden.mkdir()
    (hidden / "secret.txt").write_text("answer")
    cfg = sandbox.WorkerConfig(module_source=TOY, module_filename="toy.py", api=["add"], hide=[str(hidden)],
                               call_timeout_s=10)
    sb = sandbox.Sandbox(cfg, path)
    sb.hidden = hidden
    yield sb
    sb.close()


@pytest.fixture
def impl(toy):
    toy.ensure()
    toy.begin_test()
    return sandbox.RemoteModule(toy, toy.module_path, "toy")


def test_calls_return_values_and_exceptions_keep_their_class(impl):
    assert impl.add(2, y=3) == 5
    x = torch.randn(3)
    assert torch.equal(impl.add(x), x + 1)
    with pytest.raises(ValueError, match="bad x=3"):
        impl.fail("value")
    with pytest.raises(RuntimeError, match="SystemExit"):
        impl.fail("sysexit")  # a SystemExit is an error of the call, not the end of anything


def test_inputs_are_copies_and_outputs_fresh(impl):
    x = torch.ones(4)
    out = impl.scale_(x)
    assert torch.equal(x, torch.ones(4)), "the grader's tensor changed"
    assert torch.equal(out, torch.full((4,), 2.0)) and out.data_ptr() != x.data_ptr()


def test_tensor_subclasses_come_back_as_handles(impl):
    out = impl.subclass(torch.randn(3))
    assert isinstance(out, RemoteObject) and not isinstance(out, torch.Tensor)


def test_objects_are_handles_with_methods_attributes_and_state(impl):
    m = impl.Counter(4)
    assert is_instance(m, torch.nn.Module) and is_instance(m.lin, torch.nn.Linear)
    x = torch.randn(2, 4)
    sd = m.state_dict()
    want = x @ sd["lin.weight"].T + sd["lin.bias"]
    assert torch.allclose(m(x), want) and m.n == 1
    m.load_state_dict({k: torch.zeros_like(v) for k, v in sd.items()})
    assert torch.equal(m(x), torch.zeros(2, 4)) and m.me().n == 2
    assert [n for n, _ in m.named_parameters()] == ["lin.weight", "lin.bias"]


def test_handles_do_not_outlive_their_test(impl, toy):
    m = impl.Counter(2)
    toy.begin_test()
    with pytest.raises(SandboxError, match="earlier test"):
        impl.add(m)


def test_environment_is_scrubbed_and_user_dropped(impl, monkeypatch):
    env = impl.env()
    assert not [k for k in env if k.startswith("LABS_") or "SEED" in k], env
    if os.geteuid() == 0:
        assert impl.whoami() != 0


def test_hidden_paths_and_network_are_out_of_reach(impl, toy):
    if not isolation.isolation_prefix() and os.geteuid() != 0:
        pytest.skip("no namespaces and no other user on this host")
    assert not impl.can_read(str(toy.hidden / "secret.txt"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        if isolation.isolation_prefix():
            assert not impl.connect(listener.getsockname()[1])
    finally:
        listener.close()


def test_exit_in_a_call_fails_that_call_and_a_fresh_worker_follows(impl, toy):
    with pytest.raises(WorkerCrashed, match="exited with code 0"):
        impl.fail("exit")
    toy.begin_test()
    assert impl.add(1) == 2


def test_a_hanging_call_times_out_and_the_next_call_works(impl, toy):
    with pytest.raises(WorkerTimeout, match="did not answer within 10 s"):
        impl.fail("sleep")
    assert impl.add(1) == 2


def test_memory_limit_turns_a_blow_up_into_an_error(impl):
    with pytest.raises((RuntimeError, MemoryError)):
        impl.big(64 << 30)
    assert impl.add(1) == 2


def test_measure_and_vjp_work_remotely(impl):
    q = torch.randn(1, 1, 3, 8)
    out, m = measure(impl.sdpa_user, q)
    assert torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, q, q), atol=1e-6)
    assert any("scaled_dot_product" in op for op in m.ops) and m.wall_s > 0
    with pytest.raises(AssertionError, match="called torch.nn.functional.scaled_dot_product_attention"):
        measure(impl.sdpa_user, q, forbid=["torch.nn.functional.scaled_dot_product_attention"])
    x = torch.randn(5, requires_grad=True)
    out, (g,) = vjp(impl.square, (x,), torch.ones(5))
    assert torch.allclose(g, 2 * x.detach()) and x.grad is None
    assert gradcheck(impl.square, (torch.randn(4, dtype=torch.float64),))


def test_memory_is_read_from_outside_whatever_the_code_hides(impl):
    x = torch.ones(1, 1 << 20)  # 4 MiB; repeated 64 times: 256 MiB
    impl.repeat(x, 2)  # warm-up
    _, honest = measure(impl.repeat, x, 64)
    assert honest.max_bytes >= 256 << 20 and honest.peak_growth_bytes >= 200 << 20
    with pytest.raises(AssertionError, match="switched off"):
        measure(impl.blind_repeat, x, 64)  # the tracker would see nothing; the guard sees the trick
    assert honest.peak_over_start_bytes >= honest.peak_growth_bytes  # plus what it held since the import


def test_resident_bytes_counts_state_kept_anywhere(impl):
    before = resident_bytes(impl)
    impl.keep(16 << 20)  # 64 MiB in a module-level dict: no object holds it
    assert resident_bytes(impl) - before >= 60 << 20


def test_restart_drops_a_memo(impl):
    assert torch.equal(impl.memo(torch.zeros(2)), torch.ones(2))
    assert torch.equal(impl.memo(torch.ones(2)), torch.ones(2))  # memoised
    restart(impl)
    assert torch.equal(impl.memo(torch.ones(2)), torch.full((2,), 2.0))


def test_forbidding_sdpa_covers_the_aten_ops_saved_at_import(impl):
    q = torch.randn(1, 1, 4, 8)
    _, m = measure(impl.sdpa_by_op, q, forbid=["torch.nn.functional.scaled_dot_product_attention"])
    assert any("scaled_dot_product" in f for f in m.forbidden_called), m.forbidden_called


def test_a_patched_tracker_fails_the_next_measured_call(toy):
    toy.kill()  # a fresh worker: the patch must not leak into other tests
    impl = sandbox.RemoteModule(toy, toy.module_path, "toy")
    impl.patch_tracker()
    with pytest.raises(AssertionError, match="replaced"):
        measure(impl.square, torch.ones(3))
    toy.kill()


def test_a_reply_far_larger_than_its_request_is_refused_unread(impl, toy):
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with pytest.raises(SandboxError, match="more than"):
        impl.huge()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10, "the reply was read"
    assert impl.add(1) == 2  # a fresh worker answers the next call


def test_import_failures_are_reported_once(tmp_path):
    cfg = sandbox.WorkerConfig(module_source="import os\nos._exit(0)\n", module_filename="bad.py", call_timeout_s=10)
    sb = sandbox.Sandbox(cfg, tmp_path / "bad.py")
    for _ in range(2):
        with pytest.raises(SandboxError, match="importing bad.py failed"):
            sb.ensure()
    sb.close()


def test_no_state_reaches_the_next_worker_through_the_zygote(tmp_path):
    """Every launcher is a fork of one warm zygote (``harness.sandbox.zygote``): what a submission
    changes in torch, its module's globals or the interpreter stays in its own worker."""
    dirty = ("import builtins, torch, torch.nn.functional as F\n"
             "torch.set_default_dtype(torch.float64)\nF.softmax = lambda *a, **k: 'PWNED'\nbuiltins.LEFT = 1\n")
    probe = ("import builtins, torch, torch.nn.functional as F\n"
             "def state():\n    return [str(torch.get_default_dtype()), F.softmax.__name__, hasattr(builtins, 'LEFT')]\n")
    parents = []
    for name, source in (("dirty.py", dirty), ("probe.py", probe)):
        sb = sandbox.Sandbox(sandbox.WorkerConfig(module_source=source, module_filename=name), tmp_path / name)
        stat = Path(f"/proc/{sb.ensure().proc.pid}/stat").read_text()
        parents.append(int(stat[stat.rindex(")") + 2:].split()[1]))
        if name == "probe.py":
            assert sandbox.RemoteModule(sb, tmp_path / name, "probe").state() == ["torch.float32", "softmax", False]
        sb.close()
    assert parents == [zygote._ZYGOTE[0].pid] * 2, "each launcher is a child of the one zygote"


# --- the same helpers in-process (--sandbox none) ------------------------------------------------

def test_helpers_work_in_process():
    def sq(x):
        return x * x

    x = torch.randn(4, requires_grad=True)
    out, (g,) = vjp(sq, (x,), torch.ones(4))
    assert torch.allclose(g, 2 * x.detach()) and x.grad is None
    out, m = measure(sq, torch.randn(100))
    assert m.max_numel == 100 and "mul" in m.ops
    assert gradcheck(sq, (torch.randn(3, dtype=torch.float64),))
    assert not gradcheck(lambda x: (x * x).detach() + x, (torch.randn(3, dtype=torch.float64),))
