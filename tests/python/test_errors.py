"""Errors from Python: exceptions per status carrying pdx_last_error()'s
text; a garbage or damaged blob raises pdx.Corrupt with the reason; a
killed peer raises pdx.RemoteDisconnect within a bound; released or closed
objects raise pdx.Closed, never crash; a wrong config file raises
pdx.ConfigError naming the JSON path."""
import json
import os
import time

import numpy as np
import pytest

import pdx
import pdx.nixl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs", "glm52-fp8-mtp")


def test_exception_classes():
    assert issubclass(pdx.Timeout, TimeoutError)
    assert issubclass(pdx.RemoteDisconnect, ConnectionError)
    assert issubclass(pdx.InvalidArgument, ValueError)
    assert issubclass(pdx.NotFound, LookupError)
    assert issubclass(pdx.Closed, pdx.Error)
    for cls in (pdx.Corrupt, pdx.Mismatch, pdx.Stale, pdx.ConfigError,
                pdx.Busy, pdx.Unsupported, pdx.PolicyError):
        assert issubclass(cls, pdx.Error)
    assert pdx.status_string(-6)


def test_garbage_blob():
    with pdx.Agent("blob-a") as a, pdx.Agent("blob-b") as b:
        b.register(bytearray(4096))
        good = b.describe()
        for bad in (b"garbage, not a pdx blob" * 4, good[:len(good) // 2]):
            with pytest.raises((pdx.Corrupt, pdx.VersionError)) as e:
                a.load_peer(bad)
            assert e.value.reason and str(e.value) == e.value.reason
            assert e.value.status in (-9, -10)
        flipped = bytearray(good)
        flipped[len(flipped) // 2] ^= 0x40
        with pytest.raises(pdx.Corrupt) as e:
            a.load_peer(bytes(flipped))
        assert e.value.status == -9 and len(str(e.value)) > 10
        with pytest.raises(pdx.Corrupt):
            pdx.blob_describe(b"\x00" * 64)
        assert "blob-b" in pdx.blob_describe(good)
        # Still usable afterwards.
        assert a.load_peer(good) == "blob-b"
        with pytest.raises(pdx.NotFound):
            a.peer_state("nobody")


def test_killed_peer_raises_remote_disconnect(spawn):
    size = 1 << 20
    v = spawn("victim", size)
    blob, raddr, pid = v.recv()
    with pdx.Agent("survivor") as a:
        dst = pdx.mem_alloc(size)
        a.register(dst)
        peer = a.load_peer(blob)
        x = a.create_xfer("READ", [(dst.addr, size, 0)],
                          [(raddr, size, 0)], peer)
        x.post()
        x.wait(timeout=20)
        v.kill()
        t0 = time.monotonic()
        err = None
        while time.monotonic() - t0 < 10:
            try:
                x.post()
                x.wait(timeout=5)
            except pdx.RemoteDisconnect as e:
                err = e
                break
            time.sleep(0.01)
        took = time.monotonic() - t0
        assert err is not None, "no RemoteDisconnect within 10 s"
        assert took < 5, took
        assert err.status == -6 and err.reason
        assert a.peer_state(peer) == "disconnected"
        x.release()
        # A new request to the dead peer fails the same way.
        with pytest.raises(pdx.RemoteDisconnect):
            y = a.create_xfer("READ", [(dst.addr, 64, 0)],
                              [(raddr, 64, 0)], peer)
            try:
                y.post()
                y.wait(timeout=5)
            finally:
                y.release()
        a.unload_peer(peer)


def test_released_and_closed_objects_raise():
    a = pdx.Agent("rel-a")
    b = pdx.Agent("rel-b")
    src = pdx.mem_alloc(8192)
    dst = np.zeros(8192, np.uint8)
    rs = b.register(src)
    rd = a.register(dst)
    peer = a.load_peer(b.describe())
    local = a.prep_dlist([(dst.ctypes.data, 4096, 0)])
    remote = a.prep_dlist([(src.addr, 4096, 0)], peer)
    x = a.make_xfer("READ", local, [0], remote, [0])
    x.release()
    x.release()  # idempotent
    for call in (x.post, x.check, x.abort, x.telemetry,
                 lambda: x.wait(timeout=1), lambda: x.segments):
        with pytest.raises(pdx.Closed):
            call()
    remote.release()
    with pytest.raises(pdx.Closed):
        a.make_xfer("READ", local, [0], remote, [0])
    y = a.make_xfer("WRITE", local, [0],
                    a.prep_dlist([(src.addr, 4096, 0)], peer), [0])
    a.close()
    a.close()  # idempotent
    for call in (a.describe, lambda: a.load_peer(b.describe()),
                 lambda: a.register(bytearray(10)), y.post, y.check,
                 lambda: a.get_notifs(), lambda: a.prep_dlist([(1, 1, 0)]),
                 lambda: a.make_xfer("READ", local, [0], local, [0])):
        with pytest.raises(pdx.Closed):
            call()
    assert not rd.registered and a.closed
    rd.deregister()  # after close: releases the buffer, no call into pdx
    y.release()
    local.release()
    with pytest.raises(pdx.Closed):
        with a:
            pass
    rs.deregister()
    b.close()
    src.close()
    with pytest.raises(pdx.Closed):
        np.frombuffer(src, np.uint8)
    with pytest.raises(pdx.InvalidArgument):
        pdx.Agent("bad name with spaces")
    with pytest.raises(pdx.NotFound):
        pdx.Agent("no-such-backend", backends=["nonexistent"])


def test_wrong_config_names_json_path(tmp_path):
    with open(os.path.join(CONFIGS, "prefill.json")) as f:
        cfg = json.load(f)
    cfg["kv"]["num_blocks"] = "many"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(pdx.ConfigError) as e:
        pdx.KVConfig.load(str(path))
    assert "$.kv.num_blocks" in str(e.value) and "bad.json" in str(e.value)
    cfg["kv"]["num_blocks"] = 16
    cfg["connector"]["children"][1]["budget_bytes"] = 1024
    path.write_text(json.dumps(cfg))
    with pytest.raises(pdx.ConfigError) as e:
        pdx.KVConfig.load(path)
    assert "$.connector.children[1].budget_bytes" in str(e.value)
    with pytest.raises(pdx.NotFound):
        pdx.KVConfig.load(str(tmp_path / "missing.json"))
    good = pdx.KVConfig.load(os.path.join(CONFIGS, "prefill.json"))
    assert good.role == "producer" and good.num_arenas == 101
    assert good.bytes_per_block == 3502592
    assert [b["name"] for b in good.backends] == ["ucx", "cuda_ipc"]


def test_close_while_other_threads_wait():
    """Closing an agent while other threads wait in it: they get
    pdx.Closed (or their result) promptly; nothing crashes."""
    import threading
    a = pdx.Agent("thr-a")
    b = pdx.Agent("thr-b")
    src = pdx.mem_alloc(1 << 20)
    b.register(src)
    dst = np.zeros(1 << 20, np.uint8)
    a.register(dst)
    peer = a.load_peer(b.describe())
    local = a.prep_dlist([(dst.ctypes.data + i * 4096, 4096, 0)
                          for i in range(256)])
    remote = a.prep_dlist([(src.addr + i * 4096, 4096, 0)
                           for i in range(256)], peer)
    errors, done = [], []

    def notif_waiter():
        try:
            a.get_notifs(timeout=30)
            done.append("notifs")
        except pdx.Closed:
            done.append("closed")
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    def mover(k):
        try:
            for i in range(200000):
                x = a.make_xfer("READ", local, [(i + k) % 256], remote,
                                [(i * 7 + k) % 256])
                x.post()
                x.wait(timeout=10)
                x.release()
        except pdx.Closed:
            done.append("closed")
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=notif_waiter)] + \
        [threading.Thread(target=mover, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    # One request used from two threads at once is refused, not raced.
    x = a.make_xfer("READ", local, list(range(256)), remote,
                    list(range(256)))
    x.post()
    t0 = time.monotonic()
    a.close()
    for t in threads:
        t.join(20)
        assert not t.is_alive()
    assert time.monotonic() - t0 < 10
    assert errors == [] and done.count("closed") >= 1, (errors, done)
    with pytest.raises(pdx.Closed):
        x.check()
    x.release()
    b.close()
    src.close()


def test_one_request_two_threads():
    import threading
    with pdx.Agent("busy-a") as a, pdx.Agent("busy-b") as b:
        src = pdx.mem_alloc(64 << 20)
        b.register(src)
        dst = pdx.mem_alloc(64 << 20)
        a.register(dst)
        peer = a.load_peer(b.describe())
        x = a.create_xfer("READ", [(dst.addr, 64 << 20, 0)],
                          [(src.addr, 64 << 20, 0)], peer)
        seen = []
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                try:
                    x.check()
                except pdx.Busy:
                    seen.append("busy")
                except pdx.Error:
                    pass

        t = threading.Thread(target=spin)
        t.start()
        for _ in range(20):
            try:
                x.post()
                x.wait(timeout=10)
            except pdx.Busy:
                seen.append("busy")  # refused, not raced
                time.sleep(0.01)
        stop.set()
        t.join(10)
        x.release()
        assert not t.is_alive()
        x.wait  # the object is still a valid Python object
        with pytest.raises(pdx.Closed):
            x.check()


def test_timeouts_refuse_nan_and_negative():
    """Every timeout argument refuses nan and negative values (-inf too)
    at once with pdx.InvalidArgument naming the call; a non-number is a
    TypeError; inf means no limit where a wait may be unbounded and is
    refused where it is a stored limit (xfer_timeout)."""
    nan, inf = float("nan"), float("inf")
    for bad in (nan, -inf, -1, -0.001):
        with pytest.raises(pdx.InvalidArgument, match="xfer_timeout"):
            pdx.Agent("to-bad", backends=[], xfer_timeout=bad)
    with pytest.raises(pdx.InvalidArgument, match="xfer_timeout"):
        pdx.Agent("to-bad", backends=[], xfer_timeout=inf)
    with pytest.raises(TypeError, match="xfer_timeout"):
        pdx.Agent("to-bad", backends=[], xfer_timeout="5")
    with pdx.Agent("to-a") as a, pdx.Agent("to-b") as b:
        src = pdx.mem_alloc(4096)
        dst = bytearray(4096)
        a.register(src)
        b.register(dst)
        b.load_peer(a.describe())
        a.load_peer(b.describe())
        x = b.create_xfer("READ", [(pdx.addr_of(dst), 4096, 0)],
                          [(src.addr, 4096, 0)], "to-a")
        x.post()
        for bad in (nan, -inf, -1):
            t0 = time.monotonic()
            with pytest.raises(pdx.InvalidArgument, match="get_notifs") as e:
                a.get_notifs(timeout=bad)
            assert "timeout" in str(e.value)
            with pytest.raises(pdx.InvalidArgument, match="wait"):
                x.wait(timeout=bad)
            with pytest.raises(pdx.InvalidArgument, match="fetch_peer"):
                a.fetch_peer("to-b", timeout=bad)
            assert time.monotonic() - t0 < 1.0, "a refused timeout waited"
        for bad in ("1", b"1", [1], True):
            with pytest.raises(TypeError, match="get_notifs"):
                a.get_notifs(timeout=bad)
            with pytest.raises(TypeError, match="wait"):
                x.wait(timeout=bad)
        # inf: no limit (returns as soon as there is something).
        x.wait(timeout=inf)
        assert x.status == pdx.OK
        x.release()
        b.send_notif("to-a", b"inf")
        t0 = time.monotonic()
        got = a.get_notifs(timeout=inf)
        assert got == {"to-b": [b"inf"]}, got
        assert time.monotonic() - t0 < 10
        assert a.get_notifs(timeout=0) == {}
        assert a.get_notifs(timeout=0.01) == {}
        assert a.get_notifs(timeout=None) == {}


def test_readonly_buffers():
    """Read-only memory (bytes, a read-only memoryview) is refused by
    register unless declared readonly=True; memory registered so is never
    the destination of a local READ (create_xfer and make_xfer refuse it,
    naming the descriptor), and stays a WRITE source whose bytes arrive."""
    data = bytes(range(256)) * 16
    with pdx.Agent("ro-a") as a, pdx.Agent("ro-b") as b:
        for obj in (data, memoryview(bytearray(4096)).toreadonly()):
            with pytest.raises(pdx.InvalidArgument, match="readonly=True"):
                a.register(obj)
        ro = a.register(data, readonly=True)
        assert ro.readonly and ro.len == len(data)
        rw_buf = bytearray(len(data))
        rw = a.register(rw_buf)
        assert not rw.readonly
        dst = bytearray(len(data))
        b.register(dst)
        peer = b.load_peer(a.describe())
        a.load_peer(b.describe())
        # a READs from b into its read-only region: refused before posting.
        with pytest.raises(pdx.InvalidArgument, match="readonly=True") as e:
            a.create_xfer("READ", [(ro.addr + 100, 64, 0)],
                          [(pdx.addr_of(dst), 64, 0)], "ro-b")
        assert "descriptor 0" in str(e.value)
        # Into its writable region: fine.
        x = a.create_xfer("READ", [(rw.addr, 64, 0)],
                          [(pdx.addr_of(dst), 64, 0)], "ro-b")
        x.release()
        # WRITE from the read-only region to b: the bytes arrive.
        x = a.create_xfer("WRITE", [(ro.addr, len(data), 0)],
                          [(pdx.addr_of(dst), len(data), 0)], "ro-b")
        x.post()
        x.wait(timeout=20)
        x.release()
        assert bytes(dst) == data
        # The flag travels to peers: b's WRITE into a's read-only region is
        # refused before posting (a READ from it works, byte-exact).
        with pytest.raises(pdx.InvalidArgument, match="read-only") as e:
            b.create_xfer("WRITE", [(pdx.addr_of(dst), 64, 0)],
                          [(ro.addr, 64, 0)], "ro-a")
        assert "ro-a region" in str(e.value)
        back = bytearray(len(data))
        b.register(back)
        x = b.create_xfer("READ", [(pdx.addr_of(back), len(data), 0)],
                          [(ro.addr, len(data), 0)], "ro-a")
        x.post()
        x.wait(timeout=20)
        x.release()
        assert bytes(back) == data
        # Prepared lists: entry 1 is in the read-only region.
        local = a.prep_dlist([(rw.addr, 64, 0), (ro.addr, 64, 0)])
        remote = a.prep_dlist([(pdx.addr_of(dst), 64, 0)], "ro-b")
        with pytest.raises(pdx.InvalidArgument, match="local entry 1"):
            a.make_xfer("READ", local, [1], remote, [0])
        a.make_xfer("READ", local, [0], remote, [0]).release()
        a.make_xfer("WRITE", local, [1], remote, [0]).release()
        local.release()
        remote.release()
        # Deregistered: the same addresses are no longer refused by Python
        # (pdx itself then refuses unregistered memory).
        ro.deregister()
        assert peer == "ro-a"
        with pytest.raises(pdx.Error) as e:
            a.create_xfer("READ", [(ro.addr, 64, 0)],
                          [(pdx.addr_of(dst), 64, 0)], "ro-b")
        assert "readonly=True" not in str(e.value)


def test_readonly_kv_memory():
    """KV arenas are written by loads: read-only memory is refused as an
    arena or as the memory a layout is carved from, naming the problem."""
    ro = bytes(8 * 64 * 656)
    with pytest.raises(pdx.InvalidArgument, match="read-only"):
        pdx.Layout.from_tensors(64, [ro], 656, kinds="mla")
    lay = pdx.Layout.from_arenas(64, [dict(name="l0.mla", layer=0,
                                           kind="mla", bytes_per_token=656,
                                           num_blocks=8)])
    with pytest.raises(pdx.InvalidArgument, match="read-only"):
        lay.carve(bytes(lay.carve_size(4096)), 4096)
    lay.carve(pdx.mem_alloc(lay.carve_size(4096)), 4096)  # writable: fine


def test_send_notif_types():
    """send_notif takes bytes-like objects and str (sent UTF-8 encoded,
    as NIXL's genNotif does); None and other types are a TypeError naming
    the type; nothing is sent for a refused call."""
    with pdx.Agent("nt-a") as a, pdx.Agent("nt-b") as b:
        a.load_peer(b.describe())
        b.load_peer(a.describe())
        for bad in (None, 7, 1.5, ["x"], {"x": 1}):
            with pytest.raises(TypeError, match=type(bad).__name__):
                b.send_notif("nt-a", bad)
        b.send_notif("nt-a", "h\u00e9llo")
        b.send_notif("nt-a", bytearray(b"ba"))
        b.send_notif("nt-a", memoryview(b"mv"))
        got = []
        end = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < end:
            got += a.get_notifs(timeout=0.5).get("nt-b", [])
        assert got == ["h\u00e9llo".encode(), b"ba", b"mv"], got
        assert a.get_notifs(timeout=0.2) == {}


def test_path_policy_names():
    """path_policy takes 'any', 'same_host_fast' and 'native' (GPU memory
    only on its native paths: no staging through host memory); anything
    else is refused naming the three."""
    for p in ("any", "same_host_fast", "native"):
        with pdx.Agent("pp-" + p.replace("_", "-"), backends=[],
                       path_policy=p):
            pass
    with pytest.raises(pdx.InvalidArgument, match="'native'"):
        pdx.Agent("pp-bad", backends=[], path_policy="fast")


def test_small_answers_complete(monkeypatch):
    """Issue 38 item 14: repr(MemReg) and the read-only refusal print real
    numbers (they printed '0x%llx+%llu'); get_reg_descs names the
    descriptor that is not (addr, len, device) of integers; a float N x 3
    array is refused, not truncated into 0x1+2."""
    import sys
    monkeypatch.syspath_prepend(pdx.nixl.SHIM_PATH)
    for m in [m for m in sys.modules if m.split(".")[0] == "nixl"]:
        monkeypatch.delitem(sys.modules, m)
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlInvalidParamError
    buf = bytearray(8192)
    with pdx.Agent("repr-a") as a:
        r = a.register(buf)
        want = "0x%x+8192" % pdx.addr_of(buf)
        assert want in repr(r) and "%" not in repr(r), repr(r)
        ro = a.register(bytes(4096), readonly=True)
        with pytest.raises(pdx.InvalidArgument) as e:
            a.create_xfer("READ", [(ro.addr, 64, 0)], [(ro.addr, 64, 0)],
                          "nobody")
        assert "0x%x+64" % ro.addr in str(e.value), str(e.value)
        assert "%" not in str(e.value)
    n = nixl_agent("repr-n", nixl_agent_config(backends=["UCX"]))
    try:
        for bad in ([("a", 1, 0, "")], [(4096, 1, 0, ""), (1.5, 2, 0, "")],
                    [(4096, -1, 0, "")]):
            with pytest.raises(nixlInvalidParamError, match="descriptor") \
                    as e:
                n.get_reg_descs(bad, "DRAM")
            assert "descriptor %d" % (len(bad) - 1) in str(e.value)
        with pytest.raises(pdx.InvalidArgument, match="float64"):
            n.get_reg_descs(np.array([[1.5, 2.0, 0.0]]), "DRAM")
        with pytest.raises(pdx.InvalidArgument, match="negative"):
            n.get_reg_descs(np.array([[4096, -2, 0]]), "DRAM")
        with pytest.raises(pdx.InvalidArgument, match="descriptor 1"):
            n.get_xfer_descs([(4096, 8, 0), (0.5, 8, 0)], "DRAM")
    finally:
        n.close()
