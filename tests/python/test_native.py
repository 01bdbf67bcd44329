"""The native API (pdx): READ and WRITE both ways between two processes,
byte-exact; registration of numpy arrays, bytearrays, memoryviews, mmaps
and tuples; pdx.mem_alloc memory shared with a spawned worker; descriptor
lists from N x 3 arrays; prepared lists; notifications; the event fd; the
GIL released while pdx waits."""
import mmap
import selectors
import threading
import time

import numpy as np
import pytest

import pdx
from pdx_workers import pattern

SIZE = 1 << 20


def test_read_write_both_ways(spawn):
    """D (this process) and P (a worker) each READ from and WRITE to the
    other, on shared and private memory, with notifications."""
    p = spawn("native_peer", SIZE)
    blob, p_shm, p_priv = p.recv()
    with pdx.Agent("nat-d") as d:
        shm = pdx.mem_alloc(SIZE)
        arr = np.zeros(SIZE, np.uint8)  # private, numpy
        regs = [d.register(shm), d.register(arr)]
        peer = d.load_peer(blob)
        assert peer == "nat-p" and d.peer_state(peer) == "alive"
        p.send(d.describe())

        # D READs P's shared and private regions.
        for raddr, seed in ((p_shm, 1), (p_priv, 2)):
            x = d.create_xfer("READ", [(pdx.addr_of(arr), SIZE, 0)],
                              [(raddr, SIZE, 0)], peer, notif=b"r%d" % seed)
            x.post()
            x.wait(timeout=20)
            assert x.status == pdx.OK
            x.release()
            assert np.array_equal(arr, pattern(SIZE, seed))
        # D WRITEs both of P's regions from its shared memory, in pieces.
        src = np.frombuffer(shm, np.uint8)
        src[:] = pattern(SIZE, 3)
        half = SIZE // 2
        x = d.create_xfer(
            "WRITE", [(shm.addr, half, 0), (shm.addr + half, half, 0)],
            [(p_priv + half, half, 0), (p_priv, half, 0)], peer,
            notif=b"w3")
        x.post()
        x.wait(timeout=20)
        x.release()
        p.send("get", "priv")
        got = np.frombuffer(p.recv(), np.uint8)
        assert np.array_equal(got[:half], src[half:])
        assert np.array_equal(got[half:], src[:half])
        p.send("notifs", "nat-d", 3)
        assert p.recv() == [b"r1", b"r2", b"w3"]

        # P READs D's numpy array, then WRITEs D's shared memory.
        arr[:] = pattern(SIZE, 4)
        p.send("READ", "shm", 0, pdx.addr_of(arr), SIZE, b"pr")
        assert p.recv() == "ok"
        p.send("get", "shm")
        assert np.array_equal(np.frombuffer(p.recv(), np.uint8), arr)
        p.send("fill", "priv", 5)
        assert p.recv() == "ok"
        p.send("WRITE", "priv", 4096, shm.addr + 100, SIZE - 4096, b"pw")
        assert p.recv() == "ok"
        want = pattern(SIZE, 5)
        assert np.array_equal(src[100:100 + SIZE - 4096], want[4096:])
        assert np.array_equal(src[:100], pattern(SIZE, 3)[:100])
        notifs = d.get_notifs(timeout=5)
        while sum(len(v) for v in notifs.values()) < 2:
            more = d.get_notifs(timeout=5)
            assert more, "notifications from P missing: %r" % notifs
            for k, v in more.items():
                notifs.setdefault(k, []).extend(v)
        assert notifs == {"nat-p": [b"pr", b"pw"]}
        p.send("quit")
        assert p.join() == 0
        del src
        for r in regs:
            r.deregister()
        shm.close()


def test_register_buffer_kinds():
    """Every kind of memory object registers, and a local transfer (an
    agent reading its peer in this process) moves bytes between them."""
    with pdx.Agent("reg-a") as a, pdx.Agent("reg-b") as b:
        n = 256 * 1024
        ba = bytearray(pattern(n, 21).tobytes())
        np_arr = pattern(n, 22).copy()
        mm = mmap.mmap(-1, n)
        mm.write(pattern(n, 23).tobytes())
        shm = pdx.mem_alloc(n)
        np.frombuffer(shm, np.uint8)[:] = pattern(n, 24)
        raw = np.zeros(n, np.uint8)  # registered as an (addr, len) tuple
        sources = [ba, np_arr, mm, shm]
        regs = [a.register(o) for o in sources]
        regs.append(a.register((raw.ctypes.data, n, "DRAM", 0)))
        assert regs[-1].addr == raw.ctypes.data and regs[-1].len == n
        assert regs[1].mem_type == "DRAM"
        # A memoryview slice of a bigger buffer.
        big = bytearray(3 * n)
        mv = memoryview(big)[n:2 * n]
        dst_regs = [b.register(mv)]
        peer = b.load_peer(a.describe())
        for i, o in enumerate(sources):
            x = b.create_xfer("READ", [(pdx.addr_of(mv), n, 0)],
                              [(pdx.addr_of(o), n, 0)], peer)
            x.post()
            x.wait(timeout=20)
            x.release()
            assert bytes(mv) == pattern(n, 21 + i).tobytes(), i
        assert big[:n] == bytes(n) and big[2 * n:] == bytes(n)
        # The registration pins a bytearray: it cannot be resized.
        with pytest.raises(BufferError):
            ba.extend(b"x")
        regs[0].deregister()
        ba.extend(b"x")
        # Memory in use cannot be closed while registered: exported to
        # its registration, or (registered by address) Busy in pdx.
        with pytest.raises(BufferError):
            shm.close()
        regs[3].deregister()
        by_addr = a.register((shm.addr, n))
        with pytest.raises(pdx.Busy):
            shm.close()
        by_addr.deregister()
        for r in regs[1:] + dst_regs:
            r.deregister()
        assert not regs[1].registered
        mv.release()
        shm.close()
        mm.close()


def test_shared_memory_with_spawned_worker(spawn):
    """pdx.mem_alloc memory handed to a spawned worker: both map the same
    pages, and the worker's registration of it is the same-host fast
    path for this process."""
    shm = pdx.mem_alloc(SIZE, populate=True)
    view = np.frombuffer(shm, np.uint8)
    view[:] = pattern(SIZE, 10)
    w = spawn("shm_child", shm, SIZE)
    seen, child_addr, blob = w.recv()
    assert seen == pattern(SIZE, 10).tobytes()  # the child saw our bytes
    assert np.array_equal(view, pattern(SIZE, 11))  # we see the child's
    with pdx.Agent("shm-parent") as a:
        dst = pdx.mem_alloc(SIZE)
        reg = a.register(dst)
        peer = a.load_peer(blob)
        info = a.peer_info(peer) if pdx.HAVE["peer_info"] else None
        if info is not None:
            assert any(r["addr"] == child_addr and r["shared"]
                       for r in info["regions"]), info
        x = a.create_xfer("READ", [(dst.addr, SIZE, 0)],
                          [(child_addr, SIZE, 0)], peer)
        x.post()
        x.wait(timeout=20)
        if pdx.HAVE["xfer_telemetry"]:
            t = x.telemetry()
            assert t["backend"] == "cma" and "memcpy" in t["transport"], t
            assert not t["fallback"], t
        x.release()
        assert bytes(dst) == pattern(SIZE, 11).tobytes()
        w.send("quit")
        assert w.join() == 0
        reg.deregister()
        dst.close()
    del view
    shm.close()
    assert shm.closed
    with pytest.raises(pdx.Closed):
        shm.addr


def test_prepared_lists_from_arrays():
    """Descriptor lists from N x 3 arrays (no Python loop per row),
    prepared lists, requests made from index arrays and lists, reposted,
    aborted and released."""
    nblk, blen = 512, 4096
    with pdx.Agent("prep-p") as p, pdx.Agent("prep-d") as d:
        src = pdx.mem_alloc(nblk * blen)
        np.frombuffer(src, np.uint8)[:] = pattern(nblk * blen, 31)
        dst = np.zeros(nblk * blen, np.uint8)
        p.register(src)
        d.register(dst)
        peer = d.load_peer(p.describe())

        def rows(base):
            r = np.zeros((nblk, 3), np.uint64)
            r[:, 0] = base + np.arange(nblk, dtype=np.uint64) * blen
            r[:, 1] = blen
            return r

        local = d.prep_dlist(rows(dst.ctypes.data))
        dl = pdx.DescList(rows(src.addr).astype(np.int64))
        assert len(dl) == nblk and dl[3] == (src.addr + 3 * blen, blen, 0)
        assert dl.total_bytes == nblk * blen
        remote = d.prep_dlist(dl, peer)
        assert len(local) == nblk and remote.peer == peer
        rng = np.random.default_rng(5)
        li = rng.permutation(nblk)[:200]
        ri = rng.permutation(nblk)[:200]
        x = d.make_xfer("READ", local, li, remote, ri.tolist(),
                        notif=b"prep")
        x.post()
        x.wait(timeout=20)
        s = pattern(nblk * blen, 31).reshape(nblk, blen)
        got = dst.reshape(nblk, blen)
        assert np.array_equal(got[li], s[ri])
        untouched = np.setdiff1d(np.arange(nblk), li)
        assert not got[untouched].any()
        # Repost the same request: same bytes again, one more notification.
        got[li] = 0
        x.post()
        x.wait(timeout=20)
        assert np.array_equal(got[li], s[ri])
        assert x.segments >= 1
        x.abort()  # nothing in flight: a no-op
        x.release()
        assert not x.valid
        n = 0
        end = time.monotonic() + 5
        while n < 2 and time.monotonic() < end:
            n += len(p.get_notifs(timeout=0.5).get("prep-d", []))
        assert n == 2
        # Contiguous indices merge into one segment per run.
        y = d.make_xfer("READ", local, np.arange(64), remote, np.arange(64))
        assert y.segments == 1
        y.release()
        with pytest.raises(pdx.InvalidArgument):
            d.make_xfer("READ", local, [1, 2], remote, [1])
        with pytest.raises(pdx.InvalidArgument):
            pdx.DescList(np.zeros((4, 2), np.uint64))
        with pytest.raises(pdx.InvalidArgument):
            d.make_xfer("MOVE", local, [0], remote, [0])
        local.release()
        remote.release()


def test_notifications_event_fd_and_gil():
    """send_notif/get_notifs; the event fd wakes a selectors loop; pdx
    waits with the GIL released (another thread keeps running)."""
    with pdx.Agent("ev-a", progress_thread=False) as a, \
            pdx.Agent("ev-b") as b:
        b.register(pdx.mem_alloc(4096))
        a.load_peer(b.describe())
        b.load_peer(a.describe())
        assert a.get_notifs() == {}
        sel = selectors.DefaultSelector()
        sel.register(a.event_fd(), selectors.EVENT_READ)
        b.send_notif("ev-a", b"hello")
        b.send_notif("ev-a", "text is utf-8")
        got = []
        end = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < end:
            sel.select(timeout=0.5)
            a.progress()
            got += a.get_notifs().get("ev-b", [])
        sel.close()
        assert got == [b"hello", b"text is utf-8"]

        # A thread blocked in get_notifs(timeout) must not hold the GIL.
        ticks = 0
        result = {}

        def waiter():
            result["n"] = b.get_notifs(timeout=0.5)

        t = threading.Thread(target=waiter)
        t0 = time.monotonic()
        t.start()
        while t.is_alive():
            ticks += 1
        t.join()
        assert result["n"] == {}
        assert time.monotonic() - t0 >= 0.45
        assert ticks > 1000, ticks
        with pytest.raises(pdx.TooLarge):
            a.send_notif("ev-b", b"x" * (pdx.NOTIF_MAX + 1))


def test_stats_and_peer_info():
    """Structured peer view and counters (C functions of issue 11)."""
    if not pdx.HAVE["peer_info"]:
        pytest.skip("libpdx.so lacks pdx_peer_info")
    with pdx.Agent("info-a") as a, pdx.Agent("info-b") as b:
        m1, m2 = pdx.mem_alloc(8192), bytearray(4096)
        b.register(m1)
        b.register(m2)
        peer = a.load_peer(b.describe())
        info = a.peer_info(peer)
        assert info["name"] == "info-b" and info["state"] == "alive"
        assert info["same_host"] and info["pid"] > 0
        regs = {r["addr"]: r for r in info["regions"]}
        assert regs[m1.addr]["len"] == 8192 and regs[m1.addr]["shared"]
        assert regs[pdx.addr_of(m2)]["mem_type"] == "DRAM"
        assert not regs[pdx.addr_of(m2)]["shared"]
        if pdx.HAVE["stats"]:
            s = a.stats(peer=peer)
            assert s["requests"] == 0
        if pdx.HAVE["stats_json"]:
            import json
            assert isinstance(json.loads(a.stats_json()), dict)


class FakeDevice:
    def __init__(self, type, index):
        self.type, self.index = type, index


class FakeTensor:
    """What pdx reads of a torch.Tensor (torch itself is not needed)."""

    def __init__(self, arr, device="cpu", index=None):
        self._arr = arr
        self.device = FakeDevice(device, index)

    def data_ptr(self):
        return self._arr.ctypes.data

    def numel(self):
        return self._arr.size

    def element_size(self):
        return self._arr.itemsize


class FakeCudaArray:
    """An object with __cuda_array_interface__ (CuPy, Numba)."""

    def __init__(self, ptr, shape, typestr, strides=None, dev=1):
        self.__cuda_array_interface__ = {
            "data": (ptr, False), "shape": shape, "typestr": typestr,
            "strides": strides, "version": 3}
        self.device = type("D", (), {"id": dev})()


def test_tensor_like_objects():
    """Objects with data_ptr() (torch) or __cuda_array_interface__
    (CuPy) register without importing torch."""
    arr = pattern(1 << 16, 41).view(np.uint16)
    t = FakeTensor(arr)
    assert pdx.mem_info(t) == (arr.ctypes.data, 1 << 16, "DRAM", 0)
    assert pdx.mem_info(FakeTensor(arr, "cuda", 3))[2:] == ("VRAM", 3)
    cai = FakeCudaArray(0x7f0000000000, (4, 256), "<f4")
    assert pdx.mem_info(cai) == (0x7f0000000000, 4096, "VRAM", 1)
    strided = FakeCudaArray(0x7f0000000000, (4, 8), "<f2", (64, 2))
    assert pdx.mem_info(strided)[1] == 3 * 64 + 7 * 2 + 2
    with pdx.Agent("tens-a") as a, pdx.Agent("tens-b") as b:
        reg = a.register(t)
        assert reg.len == 1 << 16 and reg.mem_type == "DRAM"
        dst = FakeTensor(np.zeros(1 << 15, np.uint16))
        b.register(dst)
        peer = b.load_peer(a.describe())
        x = b.create_xfer("READ", [(dst.data_ptr(), 1 << 16, 0)],
                          [(t.data_ptr(), 1 << 16, 0)], peer)
        x.post()
        x.wait(timeout=20)
        x.release()
        assert np.array_equal(dst._arr, arr)
        # GPU memory needs cuda_ipc (or UCX with CUDA): refused here.
        if not pdx.backend_probe("cuda_ipc")["available"]:
            with pytest.raises(pdx.Error):
                a.register(cai)
