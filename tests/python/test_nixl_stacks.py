"""pdx.nixl as the NIXL of SGLang, LMCache and TensorRT-LLM: for each, two
processes make that stack's NIXL calls in its order, with its argument
shapes (written from reading the stack's current code; none of it copied),
through the 'nixl' package on PYTHONPATH (pdx's shim); bytes are checked
exactly and notifications in the stack's format. SGLang's peer recovery:
the peer is killed and check_remote_metadata turns False, a transfer to it
raises nixlRemoteDisconnectError. Plus the single-process NIXL surface the
stacks and NIXL's own tests rely on: create_backend after backends=[],
serialized descriptor lists (and malformed bytes refused), the N x 3 array
form of get_reg_descs registering the memory it describes, a 1-D array as
one region, deregistration in any order, module names, _utils, logging."""
import enum
import os
import sys
import time

import numpy as np
import pytest

import pdx
import pdx.nixl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nixl_stack_workers as W  # noqa: E402
from test_store import etcd  # noqa: E402,F401  (the private etcd fixture)

SHIM = pdx.nixl.SHIM_PATH


@pytest.fixture(autouse=True)
def nixl_shim(monkeypatch):
    """'import nixl' (and nixl_cu12, nixl_cu13) resolves to pdx's shim in
    this process and in the spawned peers, as for an unchanged stack."""
    monkeypatch.syspath_prepend(SHIM)
    monkeypatch.setenv("PYTHONPATH", SHIM + os.pathsep +
                       os.environ.get("PYTHONPATH", ""))
    for m in [m for m in sys.modules if m.split(".")[0] in
              ("nixl", "nixl_cu12", "nixl_cu13")]:
        monkeypatch.delitem(sys.modules, m)
    yield


@pytest.fixture
def peer(spawn):
    """A spawned peer running one of nixl_stack_workers' functions
    (conftest's Worker)."""
    return spawn


wait_done = W.wait_done
block_table = W.block_table


# -- SGLang -----------------------------------------------------------------
def test_sglang_sequence_and_peer_recovery(peer):
    """SGLang's prefill side here (nixl_stack_workers.
    sglang_prefill_sequence), its decode side in a peer process; host
    memory (test_nixl_vram.py: GPU memory on two hosts)."""
    d = peer(W.sglang_decode)
    W.sglang_prefill_sequence(d, d.kill)


# -- LMCache ----------------------------------------------------------------
def test_lmcache_channel_sequence(peer):
    """LMCache's sender here (nixl_stack_workers.lmcache_sender_sequence),
    its receiver in a peer process; host memory (test_nixl_vram.py: GPU
    memory on two hosts)."""
    W.lmcache_sender_sequence(peer(W.lmcache_receiver))


# -- TensorRT-LLM -----------------------------------------------------------
class TrtState(enum.Enum):
    PROC = "PROC"
    DONE = "DONE"
    ERROR = "ERR"


def test_trtllm_python_agent_sequence(peer):
    try:
        import nixl_cu13._api as api
    except ImportError:  # pragma: no cover - the shim has it
        pytest.fail("nixl_cu13 missing")
    import nixl_cu12._api  # noqa: F401  (its fallback)
    assert api.nixl_agent is pdx.nixl.nixl_agent
    g = peer(W.trtllm_peer)
    g_meta, g_cache = g.recv()
    agent = api.nixl_agent("trtllm-ctx",
                           api.nixl_agent_config(backends=["UCX"]))
    cache = W.kv_bytes(0, 11)
    agent.register_memory(agent.get_reg_descs(
        [(cache.ctypes.data, cache.nbytes, 0, "")], "DRAM"))
    name = agent.add_remote_agent(g_meta).decode()
    g.send(agent.get_agent_metadata())
    src = agent.get_xfer_descs([(cache.ctypes.data, cache.nbytes, 0)],
                               "DRAM")
    dst = agent.get_xfer_descs([(g_cache, cache.nbytes, 0)], "DRAM")
    h = agent.initialize_xfer("WRITE", src, dst, name,
                              "trtllm-req-11:done")  # str, as TRT-LLM
    assert TrtState(agent.transfer(h)) in (TrtState.PROC, TrtState.DONE)
    end = time.monotonic() + 20
    st = TrtState(agent.check_xfer_state(h))
    while st is TrtState.PROC and time.monotonic() < end:
        st = TrtState(agent.check_xfer_state(h))
    assert st is TrtState.DONE
    agent.release_xfer_handle(h)
    msg = g.recv()
    assert msg[0] == "data" and msg[1] == cache.tobytes()
    g.send("close")
    assert g.recv() == "closed"
    end = time.monotonic() + 20
    got = []
    while b"trtllm-gen:closed" not in got and time.monotonic() < end:
        got += agent.get_new_notifs().get(name, [])
    assert got == [b"trtllm-gen:closed"]
    agent.deregister_memory(agent.get_reg_descs(
        [(cache.ctypes.data, cache.nbytes, 0, "")], "DRAM"))
    agent.remove_remote_agent(name)
    agent.close()


# -- the NIXL surface, one process --------------------------------------------
def _pair(nixl_agent, nixl_agent_config, a="surf-a", b="surf-b"):
    x = nixl_agent(a, nixl_agent_config(backends=["UCX"]))
    y = nixl_agent(b, nixl_agent_config(backends=["UCX"]))
    return x, y


def _read(x, y_name, local, remote):
    h = x.initialize_xfer("READ", local, remote, y_name, b"")
    x.transfer(h)
    assert wait_done(x, h) == "DONE"
    x.release_xfer_handle(h)


def test_create_backend_after_empty_backends():
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlNotFoundError, nixlNotAllowedError
    a = nixl_agent("cb-a", nixl_agent_config(backends=[]))
    buf = bytearray(4096)
    with pytest.raises(nixlNotFoundError, match="no backend"):
        a.register_memory([(pdx.addr_of(buf), 4096, 0, "")], "DRAM")
    with pytest.raises(nixlNotFoundError, match="no such plugin"):
        a.create_backend("NOSUCH", {})
    a.create_backend("UCX", {"num_threads": "2", "device_list": "lo"})
    assert a.get_backend_params("UCX")["device_list"] == "lo"
    assert a.get_backend_mem_types("UCX") == ["DRAM", "VRAM"]
    assert "ucx" in a.agent.stats_json()
    a.register_memory([(pdx.addr_of(buf), 4096, 0, "")], "DRAM")
    with pytest.raises(nixlNotAllowedError, match="before memory"):
        a.create_backend("CUDA_IPC", {})
    a.create_backend("UCX", {})  # already there: no change
    a.close()


def test_nx3_and_1d_registration_move_the_described_bytes():
    from nixl._api import nixl_agent, nixl_agent_config
    x, y = _pair(nixl_agent, nixl_agent_config, "n3-a", "n3-b")
    try:
        src = pdx.mem_alloc(1 << 16)
        pat = np.random.default_rng(9).integers(0, 256, 1 << 16, np.uint8)
        np.frombuffer(src, np.uint8)[:] = pat
        # N x 3 array: registers src's memory, not the 24-byte array.
        table = np.array([[src.addr, 1 << 16, 0]], np.uint64)
        reg = y.get_reg_descs(table, "DRAM")
        assert reg.descCount() == 1 and reg[0][:2] == (src.addr, 1 << 16)
        y.register_memory(reg)
        # A 1-D array: one region of all its bytes.
        dst = np.zeros(1 << 16, np.uint8)
        r1 = x.register_memory(dst)
        assert r1.descCount() == 1 and r1[0][1] == dst.nbytes
        name = x.add_remote_agent(y.get_agent_metadata())
        _read(x, name, x.get_xfer_descs(dst),
              x.get_xfer_descs(table, "DRAM"))
        assert dst.tobytes() == pat.tobytes()
        x.remove_remote_agent(name)
        y.deregister_memory(reg)
        x.deregister_memory(r1)
    finally:
        x.close()
        y.close()


def test_serialized_descs_roundtrip_and_malformed():
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlInvalidParamError
    a = nixl_agent("ser-a", nixl_agent_config(backends=["UCX"]))
    try:
        rows = np.array([[1 << 40, 4096, 0], [(1 << 40) + 8192, 100, 3]],
                        np.uint64)
        xl = a.get_xfer_descs(rows, "DRAM")
        b = a.get_serialized_descs(xl)
        back = a.deserialize_descs(b)
        assert back == xl and back.descCount() == 2 and back[1] == \
            ((1 << 40) + 8192, 100, 3)
        rl = a.get_reg_descs([(1 << 40, 4096, 0, "layer0"),
                              (1 << 41, 64, 1, "")], "VRAM")
        back = a.deserialize_descs(a.get_serialized_descs(rl))
        assert back == rl and back.mem_type == "VRAM"
        assert back[0][3] == "layer0"
        with pytest.raises(nixlInvalidParamError, match="header"):
            a.deserialize_descs(b[:10])
        with pytest.raises(nixlInvalidParamError, match="magic"):
            a.deserialize_descs(b"X" * len(b))
        with pytest.raises(nixlInvalidParamError, match="need"):
            a.deserialize_descs(b[:-1])
        with pytest.raises(nixlInvalidParamError, match="after"):
            a.deserialize_descs(b + b"\0")
        huge = bytearray(b)
        huge[12:20] = (1 << 40).to_bytes(8, "little")
        with pytest.raises(nixlInvalidParamError, match="at most"):
            a.deserialize_descs(bytes(huge))
        with pytest.raises(TypeError):
            a.get_serialized_descs([(1, 2, 3)])
    finally:
        a.close()


def test_deregister_with_live_lists_any_order():
    from nixl._api import nixl_agent, nixl_agent_config
    x, y = _pair(nixl_agent, nixl_agent_config, "dr-a", "dr-b")
    try:
        src = pdx.mem_alloc(8192)
        np.frombuffer(src, np.uint8)[:] = 0x5a
        dst = bytearray(8192)
        ry = y.register_memory([(src.addr, 8192, 0, "")], "DRAM")
        rx = x.register_memory([(pdx.addr_of(dst), 8192, 0, "")], "DRAM")
        name = x.add_remote_agent(y.get_agent_metadata())
        lh = x.prep_xfer_dlist("NIXL_INIT_AGENT",
                               [(pdx.addr_of(dst), 8192, 0)], "DRAM")
        rh = x.prep_xfer_dlist(name, [(src.addr, 8192, 0)], "DRAM")
        h = x.make_prepped_xfer("READ", lh, [0], rh, [0])
        x.transfer(h)
        assert wait_done(x, h) == "DONE"
        # TRT-LLM/LMCache order: deregister with the lists and the handle
        # alive (and with a new list object): no Busy.
        x.deregister_memory(x.get_reg_descs(
            [(pdx.addr_of(dst), 8192, 0, "")], "DRAM"))
        # Still usable until released (documented).
        x.transfer(h)
        assert wait_done(x, h) == "DONE"
        assert bytes(dst) == b"\x5a" * 8192
        x.release_xfer_handle(h)
        assert x._zombies
        x.release_dlist_handle(lh)
        assert not x._zombies
        # Registering it again works once it went.
        rx = x.register_memory([(pdx.addr_of(dst), 8192, 0, "")], "DRAM")
        x.release_dlist_handle(rh)
        x.remove_remote_agent(name)
        x.deregister_memory(rx)
        y.deregister_memory(ry)
    finally:
        x.close()
        y.close()


def test_names_modules_utils_logging_and_checks():
    import nixl
    import nixl_cu12
    import nixl_cu13
    import nixl._utils as u
    from nixl.logging import get_logger
    from nixl._api import (nixl_agent, nixl_agent_config,
                           nixl_thread_sync_t)
    from nixl._bindings import (nixlNoTelemetryError, nixlXferDList,
                                nixlRegDList)
    assert nixl_cu12.nixl_agent is nixl.nixl_agent is nixl_cu13.nixl_agent
    assert issubclass(nixlNoTelemetryError, pdx.Error)
    assert nixlXferDList is pdx.nixl.nixl_xfer_dlist
    assert nixlRegDList is pdx.nixl.nixl_reg_dlist
    assert get_logger("t").name == "nixl.t"
    a1, a2 = u.malloc_passthru(1000), u.malloc_passthru(1000)
    assert a1 and a2 and a1 % 4096 == 0
    u.ba_buf(a1, 1000)
    import ctypes
    ctypes.memset(a2, 0, 1000)
    with pytest.raises(AssertionError, match="byte 0 differs"):
        u.verify_transfer(a1, a2, 1000)
    u.ba_buf(a2, 1000)
    u.verify_transfer(a1, a2, 1000)
    u.free_passthru(a1)
    u.free_passthru(a2)
    with pytest.raises(TypeError, match="sync_mode"):
        nixl_agent_config(sync_mode=1)
    cfg = nixl_agent_config(
        sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT)
    a = nixl_agent("mod-a", cfg)
    try:
        with pytest.raises(TypeError, match="bytes or str"):
            a.send_notif("nobody", 12)
        assert not a.check_remote_metadata("nobody")
        assert a.get_plugin_params("UCX")["num_threads"] == "0"
    finally:
        a.close()


def test_listener_exchange(peer):
    """NIXL's listener exchange between two processes: fetch_remote_metadata
    and send_local_metadata over TCP (127.0.0.1), descriptors as a
    serialized notification, READ byte-exact, invalidate_local_metadata;
    a malformed frame to the listener is refused and it keeps serving."""
    import socket
    from nixl._api import nixl_agent, nixl_agent_config
    t = peer(W.nixl_listener_target, 0)
    kind, port = t.recv()
    assert kind == "listening" and port > 0
    # Garbage to the listener first: refused, logged, still serving.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GARBAGE-NOT-A-FRAME")
    agent = nixl_agent("initiator", nixl_agent_config(backends=["UCX"]))
    try:
        dst = np.zeros(W.BLOCK_LEN, np.uint8)
        reg = agent.register_memory(dst)
        agent.fetch_remote_metadata("target", "127.0.0.1", port)
        agent.send_local_metadata("127.0.0.1", port)
        end = time.monotonic() + 30
        notifs = {}
        while "target" not in notifs and time.monotonic() < end:
            notifs = agent.get_new_notifs()
            time.sleep(0.002)
        assert agent.check_remote_metadata("target")
        remote = agent.deserialize_descs(notifs["target"][0])
        h = agent.initialize_xfer("READ", agent.get_xfer_descs(dst), remote,
                                  "target", b"read-done")
        agent.transfer(h)
        assert wait_done(agent, h) == "DONE"
        want = np.arange(W.BLOCK_LEN // 4, dtype=np.uint32).view(np.uint8)
        assert dst.tobytes() == want.tobytes()
        agent.release_xfer_handle(h)
        agent.remove_remote_agent("target")
        agent.invalidate_local_metadata("127.0.0.1", port)
        kind, data = t.recv()
        assert kind == "done"
        agent.deregister_memory(reg)
    finally:
        agent.close()


def test_partial_metadata_over_listener(monkeypatch):
    """NIXL's partial metadata (partial_md_example's pattern, one
    process): the target sends metadata naming its first regions to the
    initiator's listener; transfers to the others raise nixlNotFoundError
    and check_remote_metadata(name, descs) is False for them until a
    second partial send names them; READs byte-exact; a truncated partial
    blob is refused."""
    monkeypatch.setenv("PDX_NIXL_LISTEN_ADDR", "127.0.0.1")
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlNotFoundError, nixlInvalidParamError
    init = nixl_agent("pm-init", nixl_agent_config(True, True, 0))
    target = nixl_agent("pm-target", nixl_agent_config(backends=["UCX"]))
    try:
        bufs = [pdx.mem_alloc(4096) for _ in range(4)]
        for i, b in enumerate(bufs):
            np.frombuffer(b, np.uint8)[:] = 0x30 + i
        regs = [target.get_reg_descs([(b.addr, 4096, 0, "")
                                      for b in bufs[:2]], "DRAM"),
                target.get_reg_descs([(b.addr, 4096, 0, "")
                                      for b in bufs[2:]], "DRAM")]
        for r in regs:
            target.register_memory(r)
        dst = np.zeros(4096, np.uint8)
        init.register_memory(dst)
        target.send_partial_agent_metadata(regs[0], True, ["UCX"],
                                           "127.0.0.1", init.listen_port)
        x1, x2 = regs[0].trim(), regs[1].trim()
        end = time.monotonic() + 20
        while not init.check_remote_metadata("pm-target", x1) and \
                time.monotonic() < end:
            time.sleep(0.005)
        assert init.check_remote_metadata("pm-target", x1)
        assert not init.check_remote_metadata("pm-target", x2)
        with pytest.raises(nixlNotFoundError, match="partial"):
            init.initialize_xfer("READ", init.get_xfer_descs(dst),
                                 target.get_xfer_descs([x2[0]], "DRAM"),
                                 "pm-target")
        _read(init, "pm-target", init.get_xfer_descs(dst),
              init.get_xfer_descs([x1[1]], "DRAM"))
        assert dst.tobytes() == b"\x31" * 4096
        target.send_partial_agent_metadata(regs[1], True, ["UCX"],
                                           "127.0.0.1", init.listen_port)
        end = time.monotonic() + 20
        while not init.check_remote_metadata("pm-target", x2) and \
                time.monotonic() < end:
            time.sleep(0.005)
        _read(init, "pm-target", init.get_xfer_descs(dst),
              init.get_xfer_descs([x2[1]], "DRAM"))
        assert dst.tobytes() == b"\x33" * 4096
        md = target.get_partial_agent_metadata(regs[0])
        with pytest.raises(nixlInvalidParamError, match="do not fit"):
            init.add_remote_agent(md[:20])
        init.remove_remote_agent("pm-target")
    finally:
        init.close()
        target.close()


def _wait_md(agent, name, descs=None, timeout=20.0):
    end = time.monotonic() + timeout
    while not agent.check_remote_metadata(name, descs) and \
            time.monotonic() < end:
        time.sleep(0.01)
    return agent.check_remote_metadata(name, descs)


def test_etcd_mode(monkeypatch, etcd):  # noqa: F811
    """NIXL's etcd mode on pdx's etcd store (a private etcd): with
    NIXL_ETCD_ENDPOINTS set, send_local_metadata() publishes under NIXL's
    key <namespace>/<name>/metadata and fetch_remote_metadata(name) finds
    the agent by name; READ byte-exact; invalidate_local_metadata()
    removes the key and the next send_local_metadata() puts it back."""
    from nixl._api import nixl_agent, nixl_agent_config
    from pdx.nixl import _etcd
    ns = "/nixl-test-%d" % os.getpid()
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", etcd)
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", ns)
    target = nixl_agent("et-target", nixl_agent_config(backends=["UCX"]))
    init = nixl_agent("et-init", nixl_agent_config(backends=["UCX"]))
    late = nixl_agent("et-late", nixl_agent_config(backends=["UCX"]))
    view = _etcd.Store([etcd], ns, timeout=2.0)
    try:
        src = pdx.mem_alloc(8192)
        np.frombuffer(src, np.uint8)[:] = np.arange(8192) % 251
        target.register_memory([(src.addr, 8192, 0, "")], "DRAM")
        target.send_local_metadata()
        assert view.get("et-target/metadata") == \
            target.get_agent_metadata()
        dst = np.zeros(8192, np.uint8)
        init.register_memory(dst)
        init.fetch_remote_metadata("et-target")
        assert _wait_md(init, "et-target")
        _read(init, "et-target", init.get_xfer_descs(dst),
              init.get_xfer_descs([(src.addr, 8192, 0)], "DRAM"))
        assert dst.tobytes() == (np.arange(8192) % 251).astype(
            np.uint8).tobytes()
        target.invalidate_local_metadata()
        assert view.get("et-target/metadata") is None
        target.invalidate_local_metadata()  # nothing left: a no-op
        target.send_local_metadata()
        assert view.get("et-target/metadata") is not None
        late.fetch_remote_metadata("et-target")
        assert _wait_md(late, "et-target")
        init.remove_remote_agent("et-target")
    finally:
        view.close()
        late.close()
        init.close()
        target.close()
    # The agent's keys go with its store client's lease at close().
    view = _etcd.Store([etcd], ns, timeout=2.0)
    try:
        assert view.get("et-target/metadata") is None
    finally:
        view.close()


def test_etcd_partial_metadata(monkeypatch, etcd):  # noqa: F811
    """Partial metadata over etcd as NIXL's partial_md_example --etcd:
    sent under a label (required), fetched by label, the receiver allows
    only the named regions (nixlNotFoundError, check_remote_metadata
    False for the others) until a second label names more; invalidate
    removes every label."""
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlInvalidParamError, nixlNotFoundError
    from pdx.nixl import _etcd
    ns = "/nixl-ptest-%d" % os.getpid()
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", etcd)
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", ns)
    target = nixl_agent("ep-target", nixl_agent_config(backends=["UCX"]))
    init = nixl_agent("ep-init", nixl_agent_config(backends=["UCX"]))
    view = _etcd.Store([etcd], ns, timeout=2.0)
    try:
        bufs = [pdx.mem_alloc(4096) for _ in range(4)]
        for i, b in enumerate(bufs):
            np.frombuffer(b, np.uint8)[:] = (np.arange(4096) + i) % 253
        rows1 = [(b.addr, 4096, 0, "") for b in bufs[:2]]
        rows2 = [(b.addr, 4096, 0, "") for b in bufs[2:]]
        reg1 = target.get_reg_descs(rows1, "DRAM")
        reg2 = target.get_reg_descs(rows2, "DRAM")
        target.register_memory(reg1)
        target.register_memory(reg2)
        x1, x2 = reg1.trim(), reg2.trim()
        with pytest.raises(nixlInvalidParamError, match="label"):
            target.send_partial_agent_metadata(reg1, True, ["UCX"])
        target.send_partial_agent_metadata(reg1, True, ["UCX"],
                                           label="label_1")
        init.fetch_remote_metadata("ep-target", label="label_1")
        assert _wait_md(init, "ep-target", x1)
        assert not init.check_remote_metadata("ep-target", x2)
        dst = np.zeros(8192, np.uint8)
        init.register_memory(dst)
        a = dst.ctypes.data
        local = init.get_xfer_descs([(a, 4096, 0), (a + 4096, 4096, 0)],
                                    "DRAM")
        _read(init, "ep-target", local, x1)
        with pytest.raises(nixlNotFoundError):
            init.initialize_xfer("READ", local, x2, "ep-target", b"")
        target.send_partial_agent_metadata(reg2, True, ["UCX"],
                                           label="label_2")
        init.fetch_remote_metadata("ep-target", label="label_2")
        assert _wait_md(init, "ep-target", x2)
        _read(init, "ep-target", local, x2)
        want = b"".join(bytes(b) for b in bufs[2:])
        assert dst.tobytes() == want
        assert view.get("ep-target/label_1") is not None
        target.invalidate_local_metadata()
        assert view.get("ep-target/label_1") is None
        assert view.get("ep-target/label_2") is None
    finally:
        view.close()
        init.close()
        target.close()


def test_estimate_xfer_cost():
    """estimate_xfer_cost answers NIXL's shape: (duration us, error
    margin us, "ANALYTICAL_BACKEND"); the nominal model grows with the
    bytes; with telemetry captured, a request that ran is estimated by
    its measured time."""
    from nixl._api import nixl_agent, nixl_agent_config
    x = nixl_agent("ec-a", nixl_agent_config(backends=["UCX"],
                                             capture_telemetry=True))
    y = nixl_agent("ec-b", nixl_agent_config(backends=["UCX"]))
    try:
        src = np.arange(1 << 20, dtype=np.uint8)
        dst = np.zeros(1 << 20, np.uint8)
        y.register_memory(src)
        x.register_memory(dst)
        name = x.add_remote_agent(y.get_agent_metadata())
        remote = y.get_xfer_descs(src)
        small = x.initialize_xfer("READ", x.get_xfer_descs(dst[:4096]),
                                  y.get_xfer_descs(src[:4096]), name, b"")
        big = x.initialize_xfer("READ", x.get_xfer_descs(dst), remote,
                                name, b"")
        d_small, m_small, how = x.estimate_xfer_cost(small)
        d_big, m_big, how_big = x.estimate_xfer_cost(big)
        assert how == how_big == "ANALYTICAL_BACKEND"
        assert all(isinstance(v, int) and v > 0
                   for v in (d_small, m_small, d_big, m_big))
        assert d_big > d_small and m_big >= m_small
        x.transfer(big)
        assert wait_done(x, big) == "DONE"
        measured = x.get_xfer_telemetry(big).xferDuration
        d, m, how = x.estimate_xfer_cost(big)
        assert how == "ANALYTICAL_BACKEND" and d == max(1, measured)
        assert 1 <= m <= max(1, d)
        x.release_xfer_handle(small)
        x.release_xfer_handle(big)
        with pytest.raises(pdx.Closed):
            x.estimate_xfer_cost(big)
    finally:
        x.close()
        y.close()


def test_posix_query_plugin(tmp_path):
    """The "POSIX" plugin answers file queries as NIXL's (queryMem,
    query_memory on FILE descriptors: size, mode, mtime, None for a file
    that is not there). nixl_agent moves file data with it
    (test_nixl_posix.py); the low-level nixlAgent binding does not
    (registerMem of FILE refused; getAvailPlugins does not list it)."""
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl import _bindings as b
    f = tmp_path / "q.bin"
    f.write_bytes(b"x" * 23)
    missing = str(tmp_path / "none")
    a = nixl_agent("pq-a", nixl_agent_config(backends=[]))
    try:
        assert "POSIX" in a.get_plugin_list()
        assert a.get_plugin_mem_types("POSIX") == ["FILE", "DRAM"]
        a.create_backend("POSIX", a.get_plugin_params("POSIX"))
        got = a.query_memory([(0, 0, 0, str(f)), (0, 0, 0, missing)],
                             "POSIX", mem_type="FILE")
        assert got[0]["size"] == "23" and int(got[0]["mode"]) == \
            os.stat(f).st_mode and "mtime" in got[0]
        assert got[1] is None
    finally:
        a.close()
    conf = b.nixlAgentConfig()
    conf.useProgThread = False
    ag = b.nixlAgent("pq-b", conf)
    try:
        assert ag.getAvailPlugins() == ["UCX"]
        params, mems = ag.getPluginParams("POSIX")
        h = ag.createBackend("POSIX", params)
        descs = b.nixlRegDList(b.FILE_SEG)
        assert ag.queryMem(descs, h) == [] and descs.getType() == b.FILE_SEG
        descs.addDesc((0, 0, 0, missing))
        descs.addDesc((0, 0, 0, str(f)))
        got = ag.queryMem(descs, h)
        assert got[0] is None and got[1]["size"] == "23"
        with pytest.raises(b.nixlNotSupportedError, match="FILE"):
            ag.registerMem(descs, [h])
    finally:
        ag.close()


def test_torch_tensors_as_nixl():
    """Tensors as NIXL takes them: one region per contiguous tensor (its
    data_ptr, numel * element_size), a list of tensors as rows, and None
    for a non-contiguous tensor (NIXL's answer; pdx would otherwise move
    bytes in storage order); a registered tensor READ byte-exact."""
    torch = pytest.importorskip("torch", reason="python3-torch not installed")
    from nixl._api import nixl_agent, nixl_agent_config
    x, y = _pair(nixl_agent, nixl_agent_config, "tt-a", "tt-b")
    try:
        src = torch.arange(1024, dtype=torch.float32).reshape(32, 32)
        assert x.get_reg_descs(src.t()) is None
        assert x.get_xfer_descs(src.t()) is None
        r = y.register_memory(src)
        assert r.descCount() == 1 and r[0][:2] == (src.data_ptr(), 4096)
        rows = x.get_xfer_descs([src[0], src[5]])
        assert list(rows) == [(src[0].data_ptr(), 128, 0),
                              (src[5].data_ptr(), 128, 0)]
        dst = torch.zeros(32, 32, dtype=torch.float32)
        rd = x.register_memory(dst)
        name = x.add_remote_agent(y.get_agent_metadata())
        _read(x, name, x.get_xfer_descs(dst), y.get_xfer_descs(src))
        assert torch.equal(dst, src)
        x.remove_remote_agent(name)
        x.deregister_memory(rd)
        y.deregister_memory(r)
    finally:
        x.close()
        y.close()


# -- Dynamo nixl_connect ------------------------------------------------------
def test_dynamo_nixl_connect_sequence(peer):
    """Dynamo's nixl_connect active side (ReadOperation, WriteOperation):
    nixl_agent(worker_id) with the default config, the remote added from
    zlib-compressed hex metadata (its bytes name used as remote_agent),
    get_xfer_descs(descs=..., mem_type='cpu'), initialize_xfer by keyword
    with the notification key, status by transfer(h, key) then
    check_xfer_state, release_xfer_handle; the passive side polls
    update_notifs for the keys. READ and WRITE byte-exact."""
    import uuid
    import zlib
    from nixl._api import nixl_agent
    p = peer(W.dynamo_passive)
    meta = p.recv()
    agent = nixl_agent(uuid.uuid4().hex)
    try:
        local_r = np.zeros(W.BLOCKS * W.BLOCK_LEN, np.uint8)
        local_w = np.frombuffer(np.random.default_rng(4).bytes(
            2 * W.BLOCK_LEN), np.uint8).copy()
        regs = [agent.register_memory([(a.ctypes.data, a.nbytes, 0, "cpu")],
                                      "cpu") for a in (local_r, local_w)]
        remote = agent.add_remote_agent(
            zlib.decompress(bytes.fromhex(meta["nixl_metadata"])))
        p.send([meta["read_key"], meta["write_key"]])
        ops = [("READ", local_r, meta["readable"], meta["read_key"]),
               ("WRITE", local_w, meta["writable"], meta["write_key"])]
        for op, local, rdescs, key in ops:
            h = agent.initialize_xfer(
                operation=op,
                local_descs=agent.get_xfer_descs(
                    descs=[(local.ctypes.data, local.nbytes, 0)],
                    mem_type="cpu"),
                remote_descs=agent.get_xfer_descs(
                    descs=[(ptr, size, 0) for ptr, size, _ in rdescs],
                    mem_type="cpu"),
                remote_agent=remote,
                notif_msg=key.encode("utf-8"))
            state = agent.transfer(h, key.encode("utf-8"))
            end = time.monotonic() + 20
            while state == "PROC" and time.monotonic() < end:
                time.sleep(0.001)
                state = agent.check_xfer_state(h)
            assert state == "DONE", (op, state)
            agent.release_xfer_handle(h)
        assert local_r.tobytes() == W.kv_bytes(0, 21).tobytes()
        kind, written = p.recv()
        assert kind == "complete" and written == local_w.tobytes()
        p.send("bye")
        assert p.recv() == "closed"
        agent.remove_remote_agent(remote)
        for r in regs:
            agent.deregister_memory(r)
    finally:
        agent.close()


def test_loopback_to_own_name():
    """NIXL loopback: the agent's own name as the remote side
    (prep_xfer_dlist(own name) and initialize_xfer(..., own name)), bytes
    copied exactly, the notification received under the agent's own name;
    deregistration afterwards in any order."""
    from nixl._api import nixl_agent, nixl_agent_config
    a = nixl_agent("loop-a", nixl_agent_config(backends=["UCX"]))
    try:
        src = np.frombuffer(np.random.default_rng(8).bytes(4 * 4096),
                            np.uint8).copy()
        dst = np.zeros(4 * 4096, np.uint8)
        rs = a.register_memory(src)
        rd = a.register_memory(dst)
        rows = lambda arr: [(arr.ctypes.data + i * 4096, 4096, 0)  # noqa
                            for i in range(4)]
        local = a.prep_xfer_dlist("NIXL_INIT_AGENT", rows(src), "DRAM")
        remote = a.prep_xfer_dlist("loop-a", rows(dst), "DRAM")
        h = a.make_prepped_xfer("WRITE", local, [0, 1, 2, 3], remote,
                                [3, 2, 1, 0], b"loop-1")
        a.transfer(h)
        assert wait_done(a, h) == "DONE"
        want = b"".join(src[(3 - i) * 4096:(4 - i) * 4096].tobytes()
                        for i in range(4))
        assert dst.tobytes() == want
        h2 = a.initialize_xfer("READ", a.get_xfer_descs(dst[:4096]),
                               a.get_xfer_descs(src[4096:8192]), "loop-a",
                               b"loop-2")
        a.transfer(h2)
        assert wait_done(a, h2) == "DONE"
        assert dst[:4096].tobytes() == src[4096:8192].tobytes()
        got = []
        end = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < end:
            got += a.get_new_notifs().get("loop-a", [])
        assert sorted(got) == [b"loop-1", b"loop-2"]
        a.deregister_memory(rs)
        a.deregister_memory(rd)
        for x in (h, h2):
            a.release_xfer_handle(x)
        a.release_dlist_handle(local)
        a.release_dlist_handle(remote)
        assert not a._zombies
    finally:
        a.close()


def test_install_makes_nixl_pdx(monkeypatch):
    """pdx.nixl.install(): 'import nixl' (and nixl_cu12/nixl_cu13 with
    their submodules) gives pdx's shim even after another 'nixl' module
    was imported."""
    import types
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != SHIM])
    fake = types.ModuleType("nixl")
    monkeypatch.setitem(sys.modules, "nixl", fake)
    pkg = pdx.nixl.install()
    assert pkg is not fake and pkg.nixl_agent is pdx.nixl.nixl_agent
    import nixl._utils  # noqa: F401
    import nixl_cu12._bindings as b
    assert b.nixlRemoteDisconnectError is pdx.RemoteDisconnect
