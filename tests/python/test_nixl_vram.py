"""GPU memory across hosts through pdx.nixl and the KV connector: the
stacks' NIXL sequences (vLLM's pull-mode NixlConnector with heterogeneous
TP and its P killed, SGLang with peer recovery, LMCache), torch-like CUDA
tensors and __cuda_array_interface__ arrays, and the connector's GLM-5.2
arenas, each with VRAM registrations on the fake CUDA driver
(PDX_CUDA_DRIVER_LIB) and both sides in workers on two hosts of their own
(network + pid namespaces, netns_hosts.py): neither cma nor cuda_ipc can
serve them, so the bytes go over UCX (tcp), staged through pinned host
memory (Debian's UCX carries no CUDA memory). Every byte is read back
through the driver and compared, and each request's path is checked (its
telemetry: backend ucx, transport tcp, the staged fallback and why).

The sequences are the ones test_nixl_vllm.py and test_nixl_stacks.py run
with host memory in one host (their workers modules hold both sides).
Skipped, with the reason, without root or the `ip` tool."""
import multiprocessing as mp
import os
import sys

import pytest

import pdx.nixl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns_hosts import Lab, hosted  # noqa: E402
from test_connector import small_config  # noqa: E402
import vram_workers  # noqa: E402

SHIM = pdx.nixl.SHIM_PATH


@pytest.fixture(scope="module")
def lab():
    """Two hosts (10.77.0.11 and .12 behind a bridge), removed at the
    end."""
    why = Lab.why_not()
    if why:
        pytest.skip(why)
    if not os.environ.get("PDX_CUDA_DRIVER_LIB"):
        pytest.skip("PDX_CUDA_DRIVER_LIB is not set: these tests run on the "
                    "fake CUDA driver (ctest python_nixl_vram sets it)")
    with Lab(2) as hosts:
        yield hosts


@pytest.fixture(autouse=True)
def nixl_shim(monkeypatch):
    """'import nixl' in the workers resolves to pdx's shim, as for an
    unchanged stack (a spawned process starts with this one's sys.path)."""
    monkeypatch.syspath_prepend(SHIM)
    monkeypatch.setenv("PYTHONPATH", SHIM + os.pathsep +
                       os.environ.get("PYTHONPATH", ""))
    yield


@pytest.fixture
def on(spawn, lab):
    """on(i, module, func, *args): a worker running module.func(conn,
    *args) on host i (conftest's Worker)."""
    def start(i, module, func, *args):
        return spawn(hosted, lab.host(i), module, func, *args)
    return start


def _pipe():
    return mp.get_context("spawn").Pipe()


def test_vllm_pull_vram_across_hosts(on):
    """vLLM's decode engine (two TP ranks, their caches on devices 0 and
    1) READs its halves of P's GPU blocks on another host: heartbeats,
    TTL eviction and a new handshake, P freeing each request after both
    ranks' notifications; every byte read back through the driver."""
    p = on(0, "nixl_vllm_workers", "vllm_prefill", 5,
           ["req-a", "req-b", "req-c"], "VRAM")
    d = on(1, "nixl_vllm_workers", "vllm_decode", p.conn, "pull", 5, "VRAM")
    assert d.recv(150) == "ok"
    assert d.join() == 0
    assert p.join() == 0


def test_vllm_prefill_killed_vram_across_hosts(on):
    """P (GPU memory, another host) killed: D's staged READs end with
    nixlRemoteDisconnectError or a failed state within a bound,
    check_remote_metadata turns False, vLLM's shutdown raises nothing."""
    p = on(0, "nixl_vllm_workers", "vllm_prefill", 9, ["never"], "VRAM")
    d = on(1, "nixl_vllm_workers", "vllm_decode", p.conn, "killed", 9,
           "VRAM")
    assert d.recv(120) == "kill P"
    p.kill()
    d.send("killed")
    assert d.recv(60) == "ok"
    assert d.join() == 0


def test_sglang_vram_across_hosts(on):
    """SGLang: KV registered "VRAM" (prefill's on device 0, decode's on
    device 1) and aux "DRAM", WRITEs in chunks and aux, notifications in
    SGLang's format, bytes checked; the decode host's process killed,
    check_remote_metadata False, nixlRemoteDisconnectError."""
    dec = on(1, "nixl_stack_workers", "sglang_decode", "VRAM")
    pre = on(0, "nixl_stack_workers", "sglang_prefill", dec.conn, "VRAM")
    assert pre.recv(120) == "kill D"
    dec.kill()
    pre.send("killed")
    assert pre.recv(60) == "ok"
    assert pre.join() == 0


def test_lmcache_vram_across_hosts(on):
    """LMCache's channel with mem type "cuda": serialized descriptors,
    three WRITEs in reverse block order, the notified last; close() in
    LMCache's order with unreleased handles."""
    r = on(1, "nixl_stack_workers", "lmcache_receiver", "VRAM")
    s = on(0, "nixl_stack_workers", "lmcache_sender", r.conn, "VRAM")
    assert s.recv(120) == "ok"
    assert s.join() == 0
    assert r.join() == 0


def test_cuda_tensors_across_hosts(on):
    """A torch-like CUDA tensor and a CuPy-like array registered as
    objects (mem type and device from them): READ VRAM -> VRAM and
    VRAM -> DRAM, WRITE of a list of two tensors (rows) into the other
    host's array; what lands in each GPU is what was sent."""
    a, b = _pipe()
    t = on(0, "vram_workers", "tensor_target", a)
    i = on(1, "vram_workers", "tensor_initiator", b)
    _, into, host = i.recv(120)
    _, src, dst = t.recv(60)
    want_src = vram_workers._pattern(1).tobytes()
    assert src == want_src  # READ sources stay as they were
    assert into == want_src and host == want_src
    assert dst == vram_workers._pattern(2).tobytes()
    for w in (i, t):
        w.send("close")
        assert w.join() == 0


def test_kv_connector_vram_arenas_across_hosts(on):
    """The KV connector over GPU arenas (GLM-5.2's 101 arenas, P on
    device 0, D on device 1): P's finished request held in its arenas, D
    looks it up and loads 8 blocks and a 10-token tail into scattered
    blocks of its own, reads them back through the driver, byte for byte;
    P frees on D's done. D's agent shows the path: P on another host,
    UCX over tcp, GPU memory staged, cma and cuda_ipc unused."""
    ntokens, nused = 8 * 64 + 10, 9
    a, b = _pipe()
    p = on(0, "vram_workers", "kv_prefill_vram", a,
           vram_workers.hosts_config(small_config("prefill.json"), 0),
           ntokens, nused)
    d = on(1, "vram_workers", "kv_decode_vram", b,
           vram_workers.hosts_config(small_config("decode.json"), 1),
           ntokens, nused)
    tag, stats = d.recv(150)
    assert tag == "loaded"
    peers = {x["name"]: x for x in stats["peers"]}
    pp = peers["glm52-p-dp0"]
    assert pp["same_host"] is False, pp
    assert pp["paths"]["ucx"]["transport"].startswith("tcp"), pp
    assert "staged through pinned host memory" in \
        pp["paths"]["ucx"]["fallback_why"], pp
    assert set(pp["paths"]) == {"ucx"}, pp  # cma and cuda_ipc declined
    assert pp["fallbacks"] >= 1 and pp["bytes"] > 0, pp
    bes = {x["name"]: x for x in stats["backends"]}
    assert set(bes) == {"ucx", "cma", "cuda_ipc"}, bes
    assert "vram staged" in bes["ucx"]["describe"], bes
    assert bes["ucx"]["bytes"] == pp["bytes"], bes
    assert bes["cma"]["requests"] == bes["cuda_ipc"]["requests"] == 0, bes
    tag, freed, held = p.recv(60)
    assert tag == "freed" and freed == [("req-glm", "done")] and held == 0
    for w in (d, p):
        w.send("quit")
        assert w.join() == 0
